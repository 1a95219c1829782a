package audit

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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
