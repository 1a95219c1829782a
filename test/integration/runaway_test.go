package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/watchdog"
	corral "github.com/corralhq/corral/sdk/go"
)

// TestWatchdogKillsCommand: with the runaway action "command", a command
// that burns its CPU quota is killed and the sandbox lives on (its files,
// later commands), with a watchdog.runaway_action event naming the pid.
func TestWatchdogKillsCommand(t *testing.T) {
	need(t)
	s := startGovServer(t, "runaway-command", func(c *server.Config) {
		c.Watchdog = watchdog.Config{CPURunawayFor: 3 * time.Second}
		c.RunawayAction = "command"
	})
	ctx := context.Background()
	sb := newTaskSandbox(t, s.c, corral.CreateOptions{Resources: corral.Resources{CPU: 0.5}})
	if _, err := sb.Run(ctx, "echo kept > /home/user/k.txt", corral.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := sb.Start(ctx, "while :; do :; done", corral.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.Wait()
	if err != nil {
		t.Fatalf("the busy command's end: %v", err)
	}
	if res.ExitCode != 137 {
		t.Fatalf("busy command exit %d, want 137 (SIGKILL)", res.ExitCode)
	}
	waitFor(t, "the runaway event", 30*time.Second, func() bool {
		return findEvent(audit(t, s.c, corral.AuditQuery{Sandbox: sb.ID}), "watchdog.runaway_action", sb.ID) != nil
	})
	got, err := s.c.Get(ctx, sb.ID)
	if err != nil || got.State != corral.StateRunning {
		t.Fatalf("the sandbox did not live on: %+v %v", got, err)
	}
	out, err := sb.Run(ctx, "cat /home/user/k.txt", corral.RunOptions{})
	if err != nil || strings.TrimSpace(out.Stdout) != "kept" {
		t.Fatalf("after the runaway: %q %v", out.Stdout, err)
	}
}
