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

// TestTwoControlPlanesOnePostgresStore runs two `corral serve` on one
// PostgreSQL store (two data dirs, as two replicas): a key made through
// the first authenticates on the second, and once revoked through the
// first it is refused (401) by the second on its very next request
// (nothing is cached); the second's audit log holds the first's key
// events, with the key that caused them.
func TestTwoControlPlanesOnePostgresStore(t *testing.T) {
	need(t)
	if why := pgtest.Unavailable(); why != "" {
		t.Fatalf("pgtest: %s (make test installs PostgreSQL)", why)
	}
	pg, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Error(err)
		}
	})
	if err := pg.CreateDatabase(context.Background(), "corral"); err != nil {
		t.Fatal(err)
	}
	url := pg.URL("corral")
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	var procs []*serveProc
	t.Cleanup(func() {
		for _, p := range procs {
			if p.running() {
				_ = p.signal(t, syscall.SIGTERM)
			}
			if t.Failed() {
				t.Logf("corral serve log (tail):\n%s", logTail(p.log.String(), 40))
			}
		}
	})
	for _, name := range []string{"a", "b"} {
		procs = append(procs, startServe(t, filepath.Join(tmp, name), freeAddr(t), "--store", url, "--no-network"))
	}
	a, b := procs[0], procs[1]
	if a.key == b.key {
		t.Fatal("the two data dirs share an admin key")
	}
	var k struct{ Key, ID string }
	if code, _, body := rest(t, a.url, a.key, "POST", "/v1/keys", map[string]any{"team": "team-x", "name": "ci"}, &k); code != 201 {
		t.Fatalf("create key on a: %d %s", code, body)
	}
	if code, _, body := rest(t, b.url, k.Key, "GET", "/v1/sandboxes", nil, nil); code != 200 {
		t.Fatalf("a's new key on b: %d %s", code, body)
	}
	if code, _, body := rest(t, a.url, a.key, "DELETE", "/v1/keys/"+k.ID, nil, nil); code != 200 {
		t.Fatalf("revoke on a: %d %s", code, body)
	}
	if code, _, body := rest(t, b.url, k.Key, "GET", "/v1/sandboxes", nil, nil); code != 401 {
		t.Fatalf("a key revoked on a, used on b: %d %s; want 401 at once", code, body)
	}
	var audit struct{ Events []store.Event }
	if code, _, body := rest(t, b.url, b.key, "GET", "/v1/audit?kind=key&team=all", nil, &audit); code != 200 {
		t.Fatalf("audit on b: %d %s", code, body)
	}
	aKey := store.KeyID(store.HashKey(a.key))
	var kinds []string
	for _, ev := range audit.Events {
		if ev.KeyID == aKey && strings.Contains(string(ev.Data), k.ID) {
			kinds = append(kinds, ev.Kind)
		}
	}
	if strings.Join(kinds, " ") != "key.created key.revoked" {
		t.Fatalf("b's audit log has %v of a's key events for %s, want key.created key.revoked", kinds, k.ID)
	}
}
