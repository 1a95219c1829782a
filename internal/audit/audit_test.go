package audit

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/store"
)

func TestRecordRedactsAndKeepsOrder(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var red egress.Redactor
	const secret = "ghp_0123456789abcdefSECRETVALUE"
	if err := red.Add("github", secret); err != nil {
		t.Fatal(err)
	}
	l := New(st, &red, nil)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				l.Record("sb1", "egress.http", map[string]any{"header": "Bearer " + secret, "i": i})
			}
		}()
	}
	wg.Wait()
	l.Sync()
	evs, err := st.ListEvents(context.Background(), store.EventFilter{SandboxID: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 400 {
		t.Fatalf("%d events stored, want 400", len(evs))
	}
	for _, e := range evs {
		if strings.Contains(string(e.Data), secret) {
			t.Fatalf("secret stored: %s", e.Data)
		}
		if !strings.Contains(string(e.Data), "[REDACTED:github]") {
			t.Fatalf("no redaction marker: %s", e.Data)
		}
	}
	l.Record("sb1", "sandbox.ended", nil)
	l.Close()
	evs, _ = st.ListEvents(context.Background(), store.EventFilter{Kind: "sandbox.ended"})
	if len(evs) != 1 || string(evs[0].Data) != "{}" {
		t.Fatalf("event queued before Close not stored: %v", evs)
	}
}

// TestStatsCountWriteFailures: a batch the store refuses after every
// retry is counted (the corral_audit_write_failures_total metric), so a
// broken store shows on the dashboard and not only in the log; a batch
// that is written is not.
func TestStatsCountWriteFailures(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	l := New(st, nil, nil)
	defer l.Close()
	l.Record("sb1", "sandbox.created", map[string]any{})
	l.Sync()
	if q, f := l.Stats(); q != 0 || f != 0 {
		t.Fatalf("after a written event: queued %d, failures %d; want 0, 0", q, f)
	}
	st.Close() // every later write fails
	l.Record("sb1", "sandbox.ended", map[string]any{})
	l.Sync()
	if _, f := l.Stats(); f != 1 {
		t.Fatalf("after a refused batch: failures %d, want 1", f)
	}
}

// TestRecordSandboxEndOnce: of several ends of one sandbox recorded at
// once through the log, exactly one ends the record and has its
// sandbox.ended event stored and observed (counted), with the record's
// reason; the events recorded before the end are stored before it; an
// end recorded after Close is still written, and decided the same way.
// Defends against two ends of one sandbox (an owner's TTL and another
// control plane's kill) both recording an end event while the record
// has one end.
func TestRecordSandboxEndOnce(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	now := time.Now().UTC()
	for _, id := range []string{"sb1", "sb2"} {
		if err := st.InsertSandbox(ctx, &store.Sandbox{ID: id, Template: "base", Runtime: "runc", Tier: "light",
			State: store.StateRunning, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	l := New(st, nil, nil)
	var mu sync.Mutex
	observed := 0
	l.Observe(func(ev *store.Event) {
		if ev.Kind == "sandbox.ended" {
			mu.Lock()
			observed++
			mu.Unlock()
		}
	})
	l.Record("sb1", "command", nil)
	reasons := []string{"killed", "ttl", "cpu_runaway", "error"}
	won := make([]bool, len(reasons))
	var wg sync.WaitGroup
	for i, r := range reasons {
		wg.Go(func() {
			ok, err := l.RecordSandboxEnd(ctx, &store.SandboxEnd{ID: "sb1", Reason: r, At: time.Now()}, "sandbox.ended", map[string]any{"reason": r})
			if err != nil {
				t.Error(err)
			}
			won[i] = ok
		})
	}
	wg.Wait()
	evs, err := st.ListEvents(ctx, store.EventFilter{SandboxID: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, w := range won {
		if w {
			n++
			if reasons[i] != rec.EndReason {
				t.Errorf("the end that counted is %q, the record says %q", reasons[i], rec.EndReason)
			}
		}
	}
	if n != 1 || observed != 1 {
		t.Fatalf("%d of %d ends counted, %d observed; want 1 and 1", n, len(reasons), observed)
	}
	if len(evs) != 2 || evs[0].Kind != "command" || evs[1].Kind != "sandbox.ended" || !strings.Contains(string(evs[1].Data), `"`+rec.EndReason+`"`) {
		t.Fatalf("events of sb1: %v; want the command, then one end with the record's reason %q", evs, rec.EndReason)
	}
	l.Close()
	for i, want := range []bool{true, false} {
		ok, err := l.RecordSandboxEnd(ctx, &store.SandboxEnd{ID: "sb2", Reason: "shutdown", At: time.Now()}, "sandbox.ended", nil)
		if err != nil || ok != want {
			t.Fatalf("end %d of sb2 after Close: %v, %v; want %v", i, ok, err, want)
		}
	}
	if evs, _ := st.ListEvents(ctx, store.EventFilter{SandboxID: "sb2"}); len(evs) != 1 {
		t.Fatalf("%d end events of sb2 recorded after Close, want 1", len(evs))
	}
	if rec, _ := st.GetSandbox(ctx, "sb2"); rec.State != store.StateEnded {
		t.Fatalf("sb2 after its end: %s", rec.State)
	}
}
