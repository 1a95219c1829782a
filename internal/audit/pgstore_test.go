package audit

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/store/pgtest"
)

// TestEventsWaitOutAStoreOutage defends against audit events lost while
// a PostgreSQL store restarts or fails over: the writer gave up on a
// batch after about 0.75 s of failed writes and dropped it (logging an
// error), so the events recorded during a restart of a few seconds were
// never stored. Events recorded while the server is down are stored
// once it is back, every one, in order.
func TestEventsWaitOutAStoreOutage(t *testing.T) {
	if why := pgtest.Unavailable(); why != "" {
		if os.Geteuid() == 0 {
			t.Fatalf("pgtest: %s (make test installs it)", why)
		}
		t.Skip(why)
	}
	pg, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "corral"); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(pg.URL("corral"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := New(st, &egress.Redactor{}, nil)
	defer l.Close()
	l.Record("sb", "before", nil)
	l.Sync()
	if err := pg.Halt(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		l.Record("sb", "during", map[string]any{"i": i})
	}
	time.Sleep(3 * time.Second) // an outage longer than the old retries
	if err := pg.Resume(); err != nil {
		t.Fatal(err)
	}
	l.Sync()
	evs, err := st.ListEvents(ctx, store.EventFilter{SandboxID: "sb", Kind: "during"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != n {
		t.Fatalf("%d of the %d events recorded during the outage were stored", len(evs), n)
	}
	for i, ev := range evs {
		if want := fmt.Sprintf(`{"i":%d}`, i); string(ev.Data) != want {
			t.Fatalf("event %d: %s, want %s", i, ev.Data, want)
		}
	}
}
