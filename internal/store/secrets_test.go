package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSecretsCRUD(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if err := s.PutSecret(ctx, &Secret{Name: "github", Hosts: []string{"api.github.com"}, Header: "Authorization", Value: "Bearer one"}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutSecret(ctx, &Secret{Name: "github", Hosts: []string{"api.github.com", "*.github.com"}, Header: "Authorization", Value: "Bearer two"}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSecret(ctx, "", "github")
		if err != nil {
			t.Fatal(err)
		}
		if got.Value != "Bearer two" || len(got.Hosts) != 2 {
			t.Fatalf("replace did not take: %+v", got)
		}
		list, err := s.ListSecrets(ctx, "")
		if err != nil || len(list) != 1 {
			t.Fatalf("list: %v %v", list, err)
		}
		if err := s.DeleteSecret(ctx, "", "github"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSecret(ctx, "", "github"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if err := s.DeleteSecret(ctx, "", "github"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
	})
}

// TestSecretAllowHTTP checks that the per-secret plain-HTTP permission is
// stored, replaced with the secret (a PUT without it turns it off again),
// and that a database made before the column existed gets it on open,
// off, with its secrets kept: an old secret is never silently allowed
// over plain HTTP.
func TestSecretAllowHTTP(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		path := bk.addr(t)
		if bk.name == "sqlite" {
			// A SQLite database made before the column existed.
			db, err := sql.Open("sqlite", "file:"+path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`CREATE TABLE secrets (name TEXT PRIMARY KEY, hosts TEXT NOT NULL, header TEXT NOT NULL,
			value TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
			INSERT INTO secrets VALUES ('old','["a.test"]','Authorization','Bearer old',1,2);`); err != nil {
				t.Fatal(err)
			}
			db.Close()
		}
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if bk.name != "sqlite" { // PostgreSQL stores began with the column: a secret put without it
			if err := s.PutSecret(ctx, &Secret{Name: "old", Hosts: []string{"a.test"}, Header: "Authorization", Value: "Bearer old"}); err != nil {
				t.Fatal(err)
			}
		}
		old, err := s.GetSecret(ctx, "", "old")
		if err != nil || old.Value != "Bearer old" || old.AllowHTTP {
			t.Fatalf("migrated secret %+v, %v; want kept, not allowed over plain HTTP", old, err)
		}
		for _, allow := range []bool{true, false} {
			if err := s.PutSecret(ctx, &Secret{Name: "old", Hosts: []string{"a.test"}, Header: "Authorization", Value: "Bearer new", AllowHTTP: allow}); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetSecret(ctx, "", "old")
			if err != nil || got.AllowHTTP != allow {
				t.Fatalf("after put with AllowHTTP=%v: %+v, %v", allow, got, err)
			}
			list, err := s.ListSecrets(ctx, "")
			if err != nil || len(list) != 1 || list[0].AllowHTTP != allow {
				t.Fatalf("list after put with AllowHTTP=%v: %+v, %v", allow, list, err)
			}
		}
	})
}

func TestEventsAppendOnlyAndFiltered(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		path := bk.addr(t)
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now().UTC()
		for i, e := range []Event{
			{SandboxID: "a", Kind: "egress.http", Data: json.RawMessage(`{"host":"x"}`)},
			{SandboxID: "b", Kind: "egress.dns"},
			{SandboxID: "a", Kind: "sandbox.created"},
			{SandboxID: "a", Kind: "egress.dns.summary"},
			{SandboxID: "a", Kind: "egressx"},
			{SandboxID: "a", Kind: "egress"},
		} {
			e.At = t0.Add(time.Duration(i) * time.Second)
			if _, err := s.AppendEvent(ctx, &e); err != nil {
				t.Fatal(err)
			}
		}
		tests := []struct {
			name string
			f    EventFilter
			want []string
		}{
			{"all", EventFilter{}, []string{"egress.http", "egress.dns", "sandbox.created", "egress.dns.summary", "egressx", "egress"}},
			{"sandbox", EventFilter{SandboxID: "b"}, []string{"egress.dns"}},
			// A kind names its family: "egress" is egress and every egress.*,
			// never egressx; the trailing-dot (README) and star forms agree.
			{"family", EventFilter{Kind: "egress"}, []string{"egress.http", "egress.dns", "egress.dns.summary", "egress"}},
			{"family dot", EventFilter{Kind: "egress."}, []string{"egress.http", "egress.dns", "egress.dns.summary", "egress"}},
			{"family star", EventFilter{Kind: "egress.*"}, []string{"egress.http", "egress.dns", "egress.dns.summary", "egress"}},
			{"kind", EventFilter{Kind: "sandbox.created"}, []string{"sandbox.created"}},
			{"kind and its family", EventFilter{Kind: "egress.dns"}, []string{"egress.dns", "egress.dns.summary"}},
			{"kind is no raw prefix", EventFilter{Kind: "egress.dn"}, nil},
			{"since", EventFilter{Since: t0.Add(5 * time.Second)}, []string{"egress"}},
			{"after id", EventFilter{AfterID: 5}, []string{"egress"}},
			{"limit", EventFilter{Limit: 1}, []string{"egress.http"}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				evs, err := s.ListEvents(ctx, tc.f)
				if err != nil {
					t.Fatal(err)
				}
				var kinds []string
				for _, e := range evs {
					kinds = append(kinds, e.Kind)
				}
				if len(kinds) != len(tc.want) {
					t.Fatalf("got %v, want %v", kinds, tc.want)
				}
				for i := range kinds {
					if kinds[i] != tc.want[i] {
						t.Fatalf("got %v, want %v", kinds, tc.want)
					}
				}
			})
		}
		// The log is append-only even for someone with the database handle.
		if _, err := s.db.Exec(`UPDATE events SET kind='x'`); err == nil {
			t.Fatal("update of events succeeded")
		}
		if _, err := s.db.Exec(`DELETE FROM events`); err == nil {
			t.Fatal("delete of events succeeded")
		}
		if bk.name == "postgres" { // TRUNCATE fires no row trigger
			if _, err := s.db.Exec(`TRUNCATE events`); err == nil {
				t.Fatal("truncate of events succeeded")
			}
		}
		s.Close()
		s, err = Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		evs, _ := s.ListEvents(ctx, EventFilter{})
		if len(evs) != 6 || string(evs[0].Data) != `{"host":"x"}` {
			t.Fatalf("after reopen: %d events, first %s", len(evs), evs[0].Data)
		}
	})
}

// TestMigrateOldSandboxesTable: a database made before the egress column
// existed gets it on open and keeps its rows.
func TestMigrateOldSandboxesTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE sandboxes (id TEXT PRIMARY KEY, template TEXT NOT NULL, runtime TEXT NOT NULL,
		tier TEXT NOT NULL, resources TEXT NOT NULL, command_timeout_ms INTEGER NOT NULL, network TEXT NOT NULL,
		metadata TEXT NOT NULL, state TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
		ended_at INTEGER, end_reason TEXT NOT NULL DEFAULT '', error TEXT NOT NULL DEFAULT '');
		INSERT INTO sandboxes VALUES ('old','base','runc','light','{}',0,'none','{}','ended',1,2,3,'killed','');`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sb, err := s.GetSandbox(context.Background(), "old")
	if err != nil {
		t.Fatal(err)
	}
	if sb.EndReason != "killed" || len(sb.Egress.Allow) != 0 {
		t.Fatalf("migrated row %+v", sb)
	}
}

// TestDatabaseFileIsPrivate: the database holds secret values; only its
// owner may read it, also when it existed with a wider mode before.
func TestDatabaseFileIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutSecret(context.Background(), &Secret{Name: "x", Hosts: []string{"a.b"}, Header: "H", Value: "0123456789"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v, want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}
}

// TestEventsTakeTheSandboxTask defends against egress events that do not
// name their task (issue 10 item 3): the DNS filter and the proxy know
// only the sandbox, so a refused exfiltration attempt was stored with an
// empty task and `corral audit --task` did not show it. Every event of a
// sandbox gets the sandbox's task when it is stored; a task named by the
// caller is kept; an event of no sandbox stays without a task.
func TestEventsTakeTheSandboxTask(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		now := time.Now()
		for id, task := range map[string]string{"sb-task": "task-1", "sb-none": ""} {
			if err := s.InsertSandbox(ctx, &Sandbox{ID: id, Template: "base", Runtime: "runc", Tier: "default",
				State: StateRunning, CreatedAt: now, ExpiresAt: now.Add(time.Hour), TaskID: task}); err != nil {
				t.Fatal(err)
			}
		}
		evs := []*Event{
			{SandboxID: "sb-task", Kind: "egress.dns"},
			{SandboxID: "sb-task", TaskID: "task-explicit", Kind: "task.call_refused"},
			{SandboxID: "sb-none", Kind: "egress.http"},
			{SandboxID: "sb-unknown", Kind: "egress.tcp"},
			{Kind: "server.started"},
			{SandboxID: "sb-task", Kind: "egress.http"},
		}
		if err := s.AppendEvents(ctx, evs); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendEvent(ctx, &Event{SandboxID: "sb-task", Kind: "file.write"}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListEvents(ctx, EventFilter{})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"task-1", "task-explicit", "", "", "", "task-1", "task-1"}
		if len(got) != len(want) {
			t.Fatalf("%d events, want %d", len(got), len(want))
		}
		for i, e := range got {
			if e.TaskID != want[i] {
				t.Errorf("event %d (%s of %q): task %q, want %q", i, e.Kind, e.SandboxID, e.TaskID, want[i])
			}
		}
		byTask, err := s.ListEvents(ctx, EventFilter{TaskID: "task-1", Kind: "egress"})
		if err != nil {
			t.Fatal(err)
		}
		if len(byTask) != 2 || byTask[0].Kind != "egress.dns" || byTask[1].Kind != "egress.http" {
			t.Fatalf("task-1's egress events: %v", byTask)
		}
	})
}

// TestLastEventID: where a follower that wants only new events starts
// (GET /v1/events/stream without a cursor): 0 on an empty log, then the
// id of the newest event, on each backend.
func TestLastEventID(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if id, err := s.LastEventID(ctx); err != nil || id != 0 {
			t.Fatalf("empty log: %d %v", id, err)
		}
		var last int64
		for i := range 3 {
			ev := &Event{Kind: "test.event", Data: []byte(`{"i":` + string(rune('0'+i)) + `}`)}
			var err error
			if last, err = s.AppendEvent(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		if id, err := s.LastEventID(ctx); err != nil || id != last || id == 0 {
			t.Fatalf("after three events: %d %v, want %d", id, err, last)
		}
	})
}
