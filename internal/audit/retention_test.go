package audit

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// appendAged stores n events, the first one age old and one a second
// apart.
func appendAged(t *testing.T, st *store.Store, n int, now time.Time, age time.Duration) []*store.Event {
	t.Helper()
	evs := make([]*store.Event, n)
	for i := range evs {
		evs[i] = &store.Event{At: now.Add(-age + time.Duration(i)*time.Second), SandboxID: "sb", Kind: "egress.dns",
			Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	if err := st.AppendEvents(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestPruneArchivesBeforeDelete defends against losing audit evidence to
// retention (issue 10 item 4: export before delete): events past the age
// bound and past the size bound are written to a file in the archive
// directory — exactly those, in order, in the JSON Lines format of
// `corral audit export`, readable only by root — and only then deleted;
// the newest events stay; one audit.pruned event says how many, which
// ids and times, why and where the archive is.
func TestPruneArchivesBeforeDelete(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	l := New(st, nil, nil)
	defer l.Close()
	now := time.Now().UTC()
	old := appendAged(t, st, 30, now, 40*24*time.Hour) // past 30 days
	recent := appendAged(t, st, 50, now, time.Hour)    // within the age
	dir := filepath.Join(t.TempDir(), "archive")
	p, err := l.Prune(ctx, Retention{MaxEvents: 40, ArchiveDir: dir}, now)
	if err != nil {
		t.Fatal(err)
	}
	// 30 by age, then 10 more of the recent ones by size.
	if p.Events != 40 || p.FirstID != old[0].ID || p.LastID != recent[9].ID || p.Reason != "age and size" {
		t.Fatalf("pruned %+v, want 40 events %d..%d by age and size", p, old[0].ID, recent[9].ID)
	}
	fi, err := os.Stat(p.Archive)
	if err != nil || fi.Mode().Perm() != 0o600 || filepath.Dir(p.Archive) != dir {
		t.Fatalf("archive %s: %v %v", p.Archive, fi, err)
	}
	f, _ := os.Open(p.Archive)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	var ids []int64
	for sc.Scan() {
		var ev store.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("archive line %q: %v", sc.Text(), err)
		}
		if ev.Kind != "egress.dns" || ev.SandboxID != "sb" || len(ev.Data) == 0 {
			t.Fatalf("archive line %q", sc.Text())
		}
		ids = append(ids, ev.ID)
	}
	if len(ids) != 40 || ids[0] != old[0].ID || ids[39] != recent[9].ID {
		t.Fatalf("archive holds %d events %v, want the 40 pruned", len(ids), ids)
	}
	l.Sync()
	left, _ := st.ListEvents(ctx, store.EventFilter{Kind: "egress.dns"})
	if len(left) != 40 || left[0].ID != recent[10].ID {
		t.Fatalf("%d events left, want the newest 40", len(left))
	}
	pr, _ := st.ListEvents(ctx, store.EventFilter{Kind: "audit.pruned"})
	if len(pr) != 1 {
		t.Fatalf("%d audit.pruned events", len(pr))
	}
	var d struct {
		Events  int64  `json:"events"`
		FirstID int64  `json:"first_id"`
		LastID  int64  `json:"last_id"`
		Reason  string `json:"reason"`
		Archive string `json:"archive"`
	}
	if err := json.Unmarshal(pr[0].Data, &d); err != nil || d.Events != 40 || d.FirstID != p.FirstID || d.LastID != p.LastID ||
		d.Reason != "age and size" || d.Archive != p.Archive {
		t.Fatalf("audit.pruned %s", pr[0].Data)
	}
	// Within the bounds now: a second prune deletes nothing, records nothing.
	if p, err := l.Prune(ctx, Retention{MaxEvents: 100, ArchiveDir: dir}, now); err != nil || p.Events != 0 {
		t.Fatalf("second prune: %+v %v", p, err)
	}
	l.Sync()
	if pr, _ := st.ListEvents(ctx, store.EventFilter{Kind: "audit.pruned"}); len(pr) != 1 {
		t.Fatalf("%d audit.pruned events after a prune with nothing to do", len(pr))
	}
}

// TestPruneKeepsEventsWhenTheArchiveFails: if the archive cannot be
// written, no event is deleted and the failure is an audit event.
func TestPruneKeepsEventsWhenTheArchiveFails(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	l := New(st, nil, nil)
	defer l.Close()
	now := time.Now().UTC()
	appendAged(t, st, 10, now, 40*24*time.Hour)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Prune(ctx, Retention{ArchiveDir: notDir}, now); err == nil {
		t.Fatal("prune with an unusable archive directory succeeded")
	}
	l.Sync()
	if left, _ := st.ListEvents(ctx, store.EventFilter{Kind: "egress.dns"}); len(left) != 10 {
		t.Fatalf("%d events left, want all 10", len(left))
	}
	if f, _ := st.ListEvents(ctx, store.EventFilter{Kind: "audit.prune_failed"}); len(f) != 1 {
		t.Fatalf("%d audit.prune_failed events, want 1", len(f))
	}
}

// TestPruneWithoutArchive: with no archive directory the events still go
// (the operator chose so) and the event says which; negative bounds turn
// retention off.
func TestPruneWithoutArchive(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	l := New(st, nil, nil)
	defer l.Close()
	now := time.Now().UTC()
	evs := appendAged(t, st, 10, now, 40*24*time.Hour)
	if p, err := l.Prune(ctx, Retention{MaxAge: -1, MaxEvents: -1, MaxCommands: -1}, now); err != nil || p.Events != 0 {
		t.Fatalf("prune with retention off: %+v %v", p, err)
	}
	p, err := l.Prune(ctx, Retention{}, now)
	if err != nil || p.Events != 10 || p.Archive != "" || p.FirstID != evs[0].ID || p.LastID != evs[9].ID || !p.To.Equal(evs[9].At.Truncate(time.Microsecond)) {
		t.Fatalf("prune: %+v %v", p, err)
	}
}

// TestPruneUsageRows checks that the retention bounds the usage rows
// too: minutes older than MaxAge are deleted, newer ones kept, the
// audit.pruned event counts them, and with the age bound off nothing is
// deleted. Without it the usage table (a row per sandbox and minute)
// would grow for ever.
func TestPruneUsageRows(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	l := New(st, nil, nil)
	defer l.Close()
	now := time.Now().UTC().Truncate(time.Minute)
	recs := []store.UsageRecord{
		{SandboxID: "sb", Bucket: now.Add(-40 * 24 * time.Hour), UsageAmounts: store.UsageAmounts{Commands: 1}},
		{SandboxID: "sb", Bucket: now.Add(-31 * 24 * time.Hour), UsageAmounts: store.UsageAmounts{Commands: 1}},
		{SandboxID: "sb", Bucket: now.Add(-time.Hour), UsageAmounts: store.UsageAmounts{Commands: 1}},
	}
	if err := st.WriteUsage(ctx, recs, nil, nil); err != nil {
		t.Fatal(err)
	}
	if p, err := l.Prune(ctx, Retention{MaxAge: -1, MaxEvents: -1, MaxCommands: -1}, now); err != nil || p.Usage != 0 {
		t.Fatalf("prune with retention off: %+v %v", p, err)
	}
	p, err := l.Prune(ctx, Retention{}, now)
	if err != nil || p.Usage != 2 {
		t.Fatalf("prune: %+v %v; want the 2 rows older than 30 days", p, err)
	}
	l.Sync()
	evs, err := st.ListEvents(ctx, store.EventFilter{Kind: "audit.pruned"})
	if err != nil || len(evs) != 1 {
		t.Fatalf("audit.pruned events %v %v", evs, err)
	}
	var d struct {
		UsageRows int64 `json:"usage_rows"`
	}
	if json.Unmarshal(evs[0].Data, &d) != nil || d.UsageRows != 2 {
		t.Fatalf("audit.pruned data %s: want usage_rows 2", evs[0].Data)
	}
	if n, err := st.PruneUsage(ctx, now.Add(-24*time.Hour)); err != nil || n != 0 {
		t.Fatalf("rows left older than a day: %d %v", n, err)
	}
}
