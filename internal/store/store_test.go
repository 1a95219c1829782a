package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRecordsSurviveReopen: what was committed is there after the
// database is closed and opened again (as after a crash and restart).
func TestRecordsSurviveReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		path := bk.addr(t)
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Millisecond)
		sb := &Sandbox{ID: "abc", Template: "base", Runtime: "runc", Tier: "light",
			Resources: Resources{CPU: 0.5, MemoryMB: 256}, CommandTimeout: 30 * time.Second, Network: "none",
			Metadata: map[string]string{"k": "v"}, State: StateRunning, CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertSandbox(ctx, sb); err == nil {
			t.Fatal("duplicate id accepted")
		}
		cid, err := s.StartCommand(ctx, &Command{SandboxID: "abc", StartedAt: now, Command: "echo hi", User: "user"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		code := 3
		if err := s.EndCommand(ctx, &Command{ID: cid, EndedAt: &now, ExitCode: &code, StdoutBytes: 3, EndReason: ""}); err != nil {
			t.Fatal(err)
		}
		if err := s.EndSandbox(ctx, "abc", "killed", "", now); err != nil {
			t.Fatal(err)
		}
		if err := s.EndSandbox(ctx, "abc", "ttl", "", now); err != nil { // first end wins
			t.Fatal(err)
		}
		if err := s.AddAPIKey(ctx, "admin", "e2b_secret", "", "admin"); err != nil {
			t.Fatal(err)
		}
		s.Close()

		s, err = Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		got, err := s.GetSandbox(ctx, "abc")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != StateEnded || got.EndReason != "killed" || got.Metadata["k"] != "v" || got.Resources.CPU != 0.5 || !got.CreatedAt.Equal(now) {
			t.Fatalf("record after reopen: %+v", got)
		}
		cmds, err := s.ListCommands(ctx, "abc")
		if err != nil || len(cmds) != 1 || *cmds[0].ExitCode != 3 || cmds[0].StdoutBytes != 3 {
			t.Fatalf("commands after reopen: %+v %v", cmds, err)
		}
		for key, want := range map[string]bool{"e2b_secret": true, "e2b_other": false, "": false} {
			k, err := s.LookupAPIKey(ctx, key)
			if want && (err != nil || k.Name == "" || k.Hash != HashKey(key)) || !want && !errors.Is(err, ErrNotFound) {
				t.Errorf("LookupAPIKey(%q) = %+v %v, want found %v", key, k, err, want)
			}
		}
		if _, err := s.GetSandbox(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing sandbox: %v", err)
		}
		if err := s.SetExpiry(ctx, "abc", now); !errors.Is(err, ErrNotFound) {
			t.Fatalf("SetExpiry on an ended sandbox: %v", err)
		}
	})
}
