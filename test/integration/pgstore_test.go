package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/store/pgtest"
)

// TestServePostgresStore runs `corral serve --store postgres://...`
// end to end on a PostgreSQL server the test starts (pgtest, 127.0.0.1,
// the password in PGPASSWORD, not in the URL): a real sandbox is
// created, runs a command and writes a file; the server stops (sandboxes
// keep running) and starts again on the same store, adopts the sandbox
// (its file is still there), and every record and audit event of the
// first run is there — kept in PostgreSQL, not in a SQLite file in the
// data dir, which the server never makes. A kill then ends the record,
// and the host holds nothing of the sandbox afterwards.
func TestServePostgresStore(t *testing.T) {
	need(t)
	if why := pgtest.Unavailable(); why != "" {
		t.Fatalf("pgtest: %s (make test installs PostgreSQL)", why)
	}
	pg, err := pgtest.Start(pgtest.Options{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "corral"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGPASSWORD", pg.Password())
	url := fmt.Sprintf("postgres://%s@127.0.0.1:%d/corral?sslmode=disable", pgtest.User, pg.Port())

	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	data := filepath.Join(tmp, "data")
	var p *serveProc
	start := func() {
		p = startServe(t, data, freeAddr(t), "--store", url, "--no-network")
	}
	stop := func() {
		if err := p.signal(t, syscall.SIGTERM); err != nil && !strings.Contains(err.Error(), "exit status 0") {
			t.Fatalf("corral serve: %v\n%s", err, logTail(p.log.String(), 40))
		}
	}
	t.Cleanup(func() {
		if p.running() {
			_ = p.signal(t, syscall.SIGTERM)
		}
		if t.Failed() {
			t.Logf("corral serve log (tail):\n%s", logTail(p.log.String(), 60))
		}
	})
	start()
	var sb sandboxJSON
	if code, _, body := rest(t, p.url, p.key, "POST", "/v1/sandboxes", map[string]any{"metadata": map[string]string{"run": "pg"}}, &sb); code != 201 && code != 200 {
		t.Fatalf("create: %d %s", code, body)
	}
	killed := false
	t.Cleanup(func() {
		if !killed && p.running() {
			rest(t, p.url, p.key, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
		}
	})
	var ex execResult
	if code, _, body := rest(t, p.url, p.key, "POST", "/v1/sandboxes/"+sb.ID+"/exec",
		map[string]any{"command": "echo kept-in-pg > /tmp/state && cat /tmp/state"}, &ex); code != 200 || ex.ExitCode != 0 || ex.Stdout != "kept-in-pg\n" {
		t.Fatalf("exec: %d %+v %s", code, ex, body)
	}
	type eventsJSON struct {
		Events []store.Event `json:"events"`
	}
	var before eventsJSON
	if code, _, body := rest(t, p.url, p.key, "GET", "/v1/audit?sandbox="+sb.ID, nil, &before); code != 200 || len(before.Events) == 0 {
		t.Fatalf("audit before restart: %d %s", code, body)
	}
	stop()

	if _, err := os.Stat(filepath.Join(data, "corral.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("DATA/corral.db exists with --store postgres (%v): records went to SQLite", err)
	}
	st, err := store.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.GetSandbox(ctx, sb.ID)
	st.Close()
	if err != nil || rec.State != store.StateRunning || rec.Metadata["run"] != "pg" {
		t.Fatalf("the sandbox's record in PostgreSQL: %+v, %v", rec, err)
	}

	start()
	var got sandboxJSON
	if code, _, body := rest(t, p.url, p.key, "GET", "/v1/sandboxes/"+sb.ID, nil, &got); code != 200 || got.State != store.StateRunning {
		t.Fatalf("after restart: %d %s; want the sandbox adopted, running", code, body)
	}
	if code, _, body := rest(t, p.url, p.key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"command": "cat /tmp/state"}, &ex); code != 200 || ex.Stdout != "kept-in-pg\n" {
		t.Fatalf("exec after restart: %d %+v %s", code, ex, body)
	}
	var after eventsJSON
	if code, _, body := rest(t, p.url, p.key, "GET", "/v1/audit?sandbox="+sb.ID, nil, &after); code != 200 {
		t.Fatalf("audit after restart: %d %s", code, body)
	}
	ids := map[int64]string{}
	kinds := map[string]bool{}
	for _, ev := range after.Events {
		ids[ev.ID] = ev.Kind
		kinds[ev.Kind] = true
	}
	for _, ev := range before.Events {
		if ids[ev.ID] != ev.Kind {
			t.Errorf("event %d (%s) of the first run is missing after the restart", ev.ID, ev.Kind)
		}
	}
	if !kinds["sandbox.adopted"] {
		t.Errorf("no sandbox.adopted event after the restart: %v", kinds)
	}
	if code, _, body := rest(t, p.url, p.key, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil); code != 204 && code != 200 {
		t.Fatalf("kill: %d %s", code, body)
	}
	killed = true
	waitFor(t, "the sandbox record to end", time.Minute, func() bool {
		rest(t, p.url, p.key, "GET", "/v1/sandboxes/"+sb.ID, nil, &got)
		return got.State == store.StateEnded
	})
	stop()
	if left := hostHolds(t, data, sb.ID); len(left) > 0 {
		t.Fatalf("the host still holds: %v", left)
	}
}
