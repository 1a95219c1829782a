package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/watchdog"
	corral "github.com/corralhq/corral/sdk/go"
)

// The brakes of issue 5 end to end: task budgets and breakers, loop
// detection, admission, the watchdog, the fault drill and crash recovery,
// all with real sandboxes. Helpers are in govern_util_test.go.

// breakerEvent is the data of a task.breaker_open or task.call_refused
// audit event.
type breakerEvent struct {
	Code   string `json:"code"`
	Budget string `json:"budget"`
	Reason string `json:"reason"`
	OnTrip string `json:"on_trip"`
}

// TestTaskBudgetCalls proves the tool-call budget: with max_calls 3 the
// first three calls of a task run (through the SDK's command stream and
// through REST exec), the fourth is refused with budget_exhausted on both
// paths (HTTP 403 with the code on REST, corral.IsBrake in the SDK) and
// by the CLI (`corral run --task` exits non-zero naming the code on
// stderr); refused calls do not count; the task's breaker is open naming
// max_calls; the sandbox is killed with end reason budget_exhausted; the
// audit log holds task.breaker_open and task.call_refused for the task;
// and `corral task raise ID --max-calls 10 --reset` reopens the task, so
// that a new sandbox in it runs a command.
func TestTaskBudgetCalls(t *testing.T) {
	c := sharedClient(t)
	ctx := context.Background()
	task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("calls"), MaxCalls: 3})
	if err != nil {
		t.Fatal(err)
	}
	if task.Budgets.MaxCalls != 3 || task.State != "open" || task.OnTrip != "kill" || task.Breaker.Open {
		t.Fatalf("new task: %+v", task)
	}
	sb := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})

	// Three calls, by both paths that run commands.
	if res, err := sb.Run(ctx, "echo one", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "one\n" {
		t.Fatalf("call 1 (SDK): %+v %v", res, err)
	}
	if status, r := restExec(t, env.url, env.key, sb.ID, "echo two"); status != 200 || r.Stdout != "two\n" {
		t.Fatalf("call 2 (REST): %d %+v", status, r)
	}
	if res, err := sb.Run(ctx, "echo three", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "three\n" {
		t.Fatalf("call 3 (SDK): %+v %v", res, err)
	}
	if got, err := c.GetTask(ctx, task.ID); err != nil || got.Usage.Calls != 3 || got.Breaker.Open {
		t.Fatalf("after 3 calls: %+v %v", got, err)
	}

	// The fourth is refused, whichever way it comes.
	_, err = sb.Run(ctx, "echo four", corral.RunOptions{Timeout: time.Minute})
	if code, status := apiCode(err); !corral.IsBrake(err) || code != corral.CodeBudgetExhausted || status != 403 {
		t.Fatalf("call 4 (SDK): err %v (code %q, status %d); want a 403 budget_exhausted brake", err, code, status)
	}
	if !strings.Contains(err.Error(), "max_calls") {
		t.Errorf("refusal does not name the budget: %v", err)
	}
	if status, r := restExec(t, env.url, env.key, sb.ID, "echo five"); status != 403 || r.Code != corral.CodeBudgetExhausted {
		t.Fatalf("call 5 (REST): %d %+v; want 403 budget_exhausted", status, r)
	}
	_, stderr, code := corralAt(t, env.url, env.key, []string{"run"}, "--task", task.ID, "--", "echo", "six")
	if code == 0 || !strings.Contains(stderr, corral.CodeBudgetExhausted) {
		t.Fatalf("corral run --task on a tripped task: exit %d, stderr %q; want non-zero and the code", code, stderr)
	}

	got, err := c.GetTask(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "tripped" || !got.Breaker.Open || got.Breaker.Code != corral.CodeBudgetExhausted || got.Breaker.Budget != "max_calls" || got.Breaker.At == nil {
		t.Fatalf("task after the trip: state %q breaker %+v", got.State, got.Breaker)
	}
	if got.Usage.Calls != 3 {
		t.Errorf("refused calls were counted: usage %d calls, want 3", got.Usage.Calls)
	}
	if ended := waitEnded(t, c, sb.ID); ended.EndReason != "budget_exhausted" {
		t.Fatalf("sandbox end reason %q, want budget_exhausted", ended.EndReason)
	}

	evs := audit(t, c, corral.AuditQuery{Task: task.ID})
	open := findEvent(evs, "task.breaker_open", "")
	refused := findEvent(evs, "task.call_refused", sb.ID)
	if open == nil || refused == nil || findEvent(evs, "sandbox.ended", sb.ID) == nil {
		t.Fatalf("audit of the task lacks task.breaker_open, task.call_refused or sandbox.ended:\n%s", eventKinds(evs))
	}
	var bd breakerEvent
	if err := json.Unmarshal(open.Data, &bd); err != nil || bd.Code != corral.CodeBudgetExhausted || bd.Budget != "max_calls" || open.Task != task.ID {
		t.Fatalf("task.breaker_open: %s (task %q) %v", open.Data, open.Task, err)
	}
	if err := json.Unmarshal(refused.Data, &bd); err != nil || bd.Code != corral.CodeBudgetExhausted {
		t.Fatalf("task.call_refused: %s %v", refused.Data, err)
	}

	// An operator raises the budget and resets the breaker.
	out, stderr, code := corralAt(t, env.url, env.key, []string{"task", "raise"}, task.ID, "--max-calls", "10", "--reset")
	if code != 0 || !strings.Contains(out, "open") || !strings.Contains(out, "3 / 10") {
		t.Fatalf("corral task raise: exit %d stdout %q stderr %q", code, out, stderr)
	}
	got, err = c.GetTask(ctx, task.ID)
	if err != nil || got.State != "open" || got.Breaker.Open || got.Budgets.MaxCalls != 10 {
		t.Fatalf("task after raise --reset: %+v %v", got, err)
	}
	sb2 := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
	if res, err := sb2.Run(ctx, "echo again", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "again\n" {
		t.Fatalf("call after the reset: %+v %v", res, err)
	}
	if findEvent(audit(t, c, corral.AuditQuery{Task: task.ID, Kind: "task.changed"}), "task.changed", "") == nil {
		t.Error("no task.changed event for the operator's change")
	}
}

// TestTaskOnTripKeepAndArtifacts proves the two trip policies. With
// on_trip "keep" the sandbox outlives the trip: further calls are still
// refused (REST 403, and `corral sandbox exec --task` exits non-zero with
// the code on stderr) while its files stay readable and it still runs
// after those refusals. With the default kill policy and an artifact
// list, the artifact is copied to DATA/artifacts/TASK/SANDBOX/ with its
// content and recorded as task.artifact before the sandbox is killed
// with end reason budget_exhausted.
func TestTaskOnTripKeepAndArtifacts(t *testing.T) {
	c := sharedClient(t)
	ctx := context.Background()

	t.Run("keep", func(t *testing.T) {
		task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("keep"), MaxCalls: 2, OnTrip: "keep"})
		if err != nil || task.OnTrip != "keep" {
			t.Fatalf("create task: %+v %v", task, err)
		}
		sb := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		if res, err := sb.Run(ctx, "echo kept > /tmp/state", corral.RunOptions{Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
			t.Fatalf("call 1: %+v %v", res, err)
		}
		if res, err := sb.Run(ctx, "cat /tmp/state", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "kept\n" {
			t.Fatalf("call 2: %+v %v", res, err)
		}
		_, err = sb.Run(ctx, "echo three", corral.RunOptions{Timeout: time.Minute})
		if code, _ := apiCode(err); code != corral.CodeBudgetExhausted {
			t.Fatalf("call 3: %v; want budget_exhausted", err)
		}
		waitEvent(t, c, corral.AuditQuery{Task: task.ID}, "task.breaker_open")
		if status, r := restExec(t, env.url, env.key, sb.ID, "echo four"); status != 403 || r.Code != corral.CodeBudgetExhausted {
			t.Fatalf("REST call after the trip: %d %+v; want 403 budget_exhausted", status, r)
		}
		_, stderr, code := corralAt(t, env.url, env.key, []string{"sandbox", "exec"}, "--task", task.ID, sb.ID, "--", "echo", "five")
		if code == 0 || !strings.Contains(stderr, corral.CodeBudgetExhausted) {
			t.Fatalf("corral sandbox exec --task after the trip: exit %d stderr %q; want non-zero and the code", code, stderr)
		}
		if data, err := sb.Files().Read(ctx, "/tmp/state"); err != nil || string(data) != "kept\n" {
			t.Fatalf("file of the kept sandbox: %q %v", data, err)
		}
		got, err := c.Get(ctx, sb.ID)
		if err != nil || got.State != corral.StateRunning {
			t.Fatalf("kept sandbox after the trip: %+v %v", got, err)
		}
		tk, err := c.GetTask(ctx, task.ID)
		if err != nil || tk.State != "tripped" || len(tk.Sandboxes) != 1 || tk.Sandboxes[0] != sb.ID {
			t.Fatalf("task of the kept sandbox: %+v %v", tk, err)
		}
		if evs := audit(t, c, corral.AuditQuery{Sandbox: sb.ID, Kind: "sandbox.ended"}); len(evs) != 0 {
			t.Fatalf("kept sandbox was ended:\n%s", eventKinds(evs))
		}
	})

	t.Run("kill with artifacts", func(t *testing.T) {
		const artifact = "/home/user/out.txt"
		task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("artifacts"), MaxCalls: 2, Artifacts: []string{artifact}})
		if err != nil || task.OnTrip != "kill" || len(task.Artifacts) != 1 {
			t.Fatalf("create task: %+v %v", task, err)
		}
		sb := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		payload := fmt.Sprintf("findings of %s: 42 widgets\n", sb.ID)
		if res, err := sb.Run(ctx, "printf '%s' '"+payload+"' > "+artifact, corral.RunOptions{Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
			t.Fatalf("write the artifact: %+v %v", res, err)
		}
		if res, err := sb.Run(ctx, "cat "+artifact, corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != payload {
			t.Fatalf("read the artifact: %+v %v", res, err)
		}
		_, err = sb.Run(ctx, "echo one more", corral.RunOptions{Timeout: time.Minute})
		if code, _ := apiCode(err); code != corral.CodeBudgetExhausted {
			t.Fatalf("call 3: %v; want budget_exhausted", err)
		}
		if ended := waitEnded(t, c, sb.ID); ended.EndReason != "budget_exhausted" {
			t.Fatalf("end reason %q, want budget_exhausted", ended.EndReason)
		}
		file := filepath.Join(env.dataDir, "artifacts", task.ID, sb.ID, "home_user_out.txt")
		if b, err := os.ReadFile(file); err != nil || string(b) != payload {
			entries, _ := filepath.Glob(filepath.Join(env.dataDir, "artifacts", task.ID, "*", "*"))
			t.Fatalf("archived artifact %s: %q %v (files there: %v)", file, b, err, entries)
		}
		evs := audit(t, c, corral.AuditQuery{Sandbox: sb.ID})
		art, end := findEvent(evs, "task.artifact", sb.ID), findEvent(evs, "sandbox.ended", sb.ID)
		if art == nil || end == nil {
			t.Fatalf("audit lacks task.artifact or sandbox.ended:\n%s", eventKinds(evs))
		}
		var ad struct {
			Path  string `json:"path"`
			Bytes int64  `json:"bytes"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(art.Data, &ad); err != nil || ad.Path != artifact || ad.Bytes != int64(len(payload)) || ad.Error != "" || art.Task != task.ID {
			t.Fatalf("task.artifact: %s (task %q) %v", art.Data, art.Task, err)
		}
		if art.ID > end.ID {
			t.Fatalf("artifact archived (#%d) after the sandbox ended (#%d)", art.ID, end.ID)
		}
	})
}

// loopRun drives one looping sequence of REST calls in a fresh sandbox of
// a fresh task: it proves that a loop_suspected warning comes in an exec
// response before the breaker opens, that the breaker opens with
// loop_detected within ten calls (the tripping call's response says so
// and the next call is refused with 403 loop_detected, on REST and in
// the SDK), and that the sandbox ends with end reason loop_detected, with
// task.loop_suspected and task.breaker_open in the audit log.
func loopRun(t *testing.T, c *corral.Client, command func(i int) string, wantExit int) {
	t.Helper()
	ctx := context.Background()
	task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("loop"), MaxCalls: 100})
	if err != nil {
		t.Fatal(err)
	}
	sb := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
	suspectedAt, detectedAt, refusedAt := 0, 0, 0
	for i := 1; i <= 10 && refusedAt == 0; i++ {
		status, r := restExec(t, env.url, env.key, sb.ID, command(i))
		switch {
		case status == 403 && r.Code == corral.CodeLoopDetected:
			refusedAt = i
			continue
		case status != 200:
			t.Fatalf("call %d %q: status %d %+v", i, command(i), status, r)
		case r.ExitCode != wantExit:
			t.Fatalf("call %d %q: exit %d (stdout %q stderr %q), want %d", i, command(i), r.ExitCode, r.Stdout, r.Stderr, wantExit)
		}
		for _, w := range r.Warnings {
			if strings.HasPrefix(w, "loop_suspected") && suspectedAt == 0 {
				suspectedAt = i
			}
			if strings.HasPrefix(w, "loop_detected") {
				detectedAt = i
			}
		}
		t.Logf("call %d: exit %d warnings %q", i, r.ExitCode, r.Warnings)
	}
	if refusedAt == 0 {
		t.Fatal("ten looping calls were all admitted")
	}
	if suspectedAt == 0 || suspectedAt >= refusedAt {
		t.Fatalf("no loop_suspected warning before the refusal at call %d (first warning at call %d)", refusedAt, suspectedAt)
	}
	if detectedAt != refusedAt-1 {
		t.Errorf("the call before the refusal (%d) did not announce loop_detected (announced at %d)", refusedAt-1, detectedAt)
	}
	_, err = sb.Run(ctx, command(refusedAt+1), corral.RunOptions{Timeout: time.Minute})
	if code, status := apiCode(err); !corral.IsBrake(err) || code != corral.CodeLoopDetected || status != 403 {
		t.Fatalf("SDK call after the trip: %v (code %q status %d); want a 403 loop_detected brake", err, code, status)
	}
	tk, err := c.GetTask(ctx, task.ID)
	if err != nil || tk.State != "tripped" || tk.Breaker.Code != corral.CodeLoopDetected {
		t.Fatalf("task after the loop: %+v %v", tk, err)
	}
	if ended := waitEnded(t, c, sb.ID); ended.EndReason != "loop_detected" {
		t.Fatalf("sandbox end reason %q, want loop_detected", ended.EndReason)
	}
	evs := audit(t, c, corral.AuditQuery{Task: task.ID, Kind: "task."})
	sus, open := findEvent(evs, "task.loop_suspected", sb.ID), findEvent(evs, "task.breaker_open", "")
	if sus == nil || open == nil || sus.ID > open.ID {
		t.Fatalf("audit lacks task.loop_suspected before task.breaker_open:\n%s", eventKinds(evs))
	}
	var bd breakerEvent
	if err := json.Unmarshal(open.Data, &bd); err != nil || bd.Code != corral.CodeLoopDetected {
		t.Fatalf("task.breaker_open: %s %v", open.Data, err)
	}
}

// TestLoopDetection proves loop detection with real call sequences: a
// retry loop (the same failing command again and again) and the seed's
// endless search (a curl to the same search with the page and a word
// varied, failing without a network) each get a loop_suspected warning
// and then trip loop_detected within ten calls (see loopRun); while a
// varied, realistic session of 25 different commands gets no warning at
// all and leaves the breaker closed.
func TestLoopDetection(t *testing.T) {
	c := sharedClient(t)
	t.Run("retry loop", func(t *testing.T) {
		loopRun(t, c, func(int) string { return "sh -c 'echo trying; exit 3'" }, 3)
	})
	t.Run("search with variations", func(t *testing.T) {
		words := []string{"python+asyncio+timeout", "python+asyncio+timeout+error", "python+asyncio+wait_for+timeout"}
		loopRun(t, c, func(i int) string {
			return fmt.Sprintf(`curl -s "https://api.search.invalid/q?query=%s&page=%d" || exit 6`, words[i%len(words)], i)
		}, 6)
	})
	t.Run("varied session", func(t *testing.T) {
		ctx := context.Background()
		task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("varied"), MaxCalls: 100})
		if err != nil {
			t.Fatal(err)
		}
		sb := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		session := []string{
			"ls -la",
			"pwd",
			"cat /etc/os-release",
			"mkdir -p project/src project/tests",
			"echo 'def add(a, b):\n    return a + b' > project/src/calc.py",
			"cat project/src/calc.py",
			"python3 -c 'print(sum(range(10)))'",
			"python3 -c 'import sys; print(sys.version_info[:2])'",
			"echo 'from calc import add\nassert add(2, 3) == 5\nprint(\"ok\")' > project/tests/test_calc.py",
			"cd project && PYTHONPATH=src python3 tests/test_calc.py",
			"wc -l project/src/calc.py project/tests/test_calc.py",
			"head -3 /etc/passwd",
			"python3 -c 'import json; print(json.dumps({\"files\": 2, \"ok\": True}))'",
			"uname -srm",
			"echo 'notes: the adder works' > notes.txt",
			"grep -c adder notes.txt",
			"ls project/src",
			"python3 -c 'import math; print(round(math.pi, 5))'",
			"date +%Y",
			"df -h / | tail -1",
			"find project -name '*.py' | sort",
			"id -un",
			"echo done with the session > summary.txt && cat summary.txt",
			"python3 -c 'print(\", \".join(sorted([\"b\", \"a\", \"c\"])))'",
			"du -sh project",
		}
		for i, cmd := range session {
			status, r := restExec(t, env.url, env.key, sb.ID, cmd)
			if status != 200 {
				t.Fatalf("call %d %q: status %d %+v", i+1, cmd, status, r)
			}
			if r.ExitCode != 0 {
				t.Fatalf("call %d %q: exit %d stderr %q", i+1, cmd, r.ExitCode, r.Stderr)
			}
			if len(r.Warnings) > 0 {
				t.Fatalf("call %d %q of a varied session was warned: %q", i+1, cmd, r.Warnings)
			}
		}
		tk, err := c.GetTask(ctx, task.ID)
		if err != nil || tk.State != "open" || tk.Breaker.Open || tk.Usage.Calls != int64(len(session)) {
			t.Fatalf("task after the varied session: %+v %v", tk, err)
		}
		if evs := audit(t, c, corral.AuditQuery{Task: task.ID, Kind: "task.loop_suspected"}); len(evs) != 0 {
			t.Fatalf("varied session recorded as a suspected loop:\n%s", eventKinds(evs))
		}
		if got, err := c.Get(ctx, sb.ID); err != nil || got.State != corral.StateRunning {
			t.Fatalf("sandbox after the varied session: %+v %v", got, err)
		}
	})
}

// TestTokensAndSandboxBudgets proves the token, sandbox-count and end
// brakes: reported tokens beyond max_tokens open the breaker (budget
// max_tokens), kill the task's sandbox and refuse a new one with
// budget_exhausted; with max_sandboxes 1 a second concurrent sandbox is
// refused (naming max_sandboxes, without opening the breaker) and one is
// admitted once the first is killed; ending a task kills its sandboxes
// (end reason task_ended) and later calls, creates and token reports
// get task_ended.
func TestTokensAndSandboxBudgets(t *testing.T) {
	c := sharedClient(t)
	ctx := context.Background()

	t.Run("tokens", func(t *testing.T) {
		task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("tokens"), MaxTokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		sb := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		got, err := c.ReportTokens(ctx, task.ID, 600)
		if err != nil || got.Usage.Tokens != 600 || got.Breaker.Open {
			t.Fatalf("600 of 1000 tokens: %+v %v", got, err)
		}
		got, err = c.ReportTokens(ctx, task.ID, 600)
		if err != nil || got.Usage.Tokens != 1200 || !got.Breaker.Open || got.Breaker.Code != corral.CodeBudgetExhausted || got.Breaker.Budget != "max_tokens" {
			t.Fatalf("1200 of 1000 tokens: %+v %v", got, err)
		}
		_, err = c.Create(ctx, corral.CreateOptions{Task: task.ID})
		if code, status := apiCode(err); !corral.IsBrake(err) || code != corral.CodeBudgetExhausted || status != 403 {
			t.Fatalf("create in a task over its tokens: %v (code %q status %d)", err, code, status)
		}
		if ended := waitEnded(t, c, sb.ID); ended.EndReason != "budget_exhausted" {
			t.Fatalf("sandbox end reason %q, want budget_exhausted", ended.EndReason)
		}
	})

	t.Run("max sandboxes", func(t *testing.T) {
		task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("sandboxes"), MaxSandboxes: 1})
		if err != nil {
			t.Fatal(err)
		}
		first := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		_, err = c.Create(ctx, corral.CreateOptions{Task: task.ID})
		if code, status := apiCode(err); code != corral.CodeBudgetExhausted || status != 403 || !strings.Contains(err.Error(), "max_sandboxes") {
			t.Fatalf("second concurrent sandbox: %v (code %q status %d); want 403 budget_exhausted naming max_sandboxes", err, code, status)
		}
		if tk, err := c.GetTask(ctx, task.ID); err != nil || tk.Breaker.Open || tk.State != "open" {
			t.Fatalf("a refused sandbox opened the breaker: %+v %v", tk, err)
		}
		if err := first.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		second := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		if res, err := second.Run(ctx, "echo admitted", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "admitted\n" {
			t.Fatalf("sandbox admitted after the kill: %+v %v", res, err)
		}
	})

	t.Run("end task", func(t *testing.T) {
		task, err := c.CreateTask(ctx, corral.TaskOptions{Agent: agentName("end")})
		if err != nil {
			t.Fatal(err)
		}
		a := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		b := newTaskSandbox(t, c, corral.CreateOptions{Task: task.ID})
		ended, err := c.EndTask(ctx, task.ID)
		if err != nil || ended.State != "ended" || ended.EndedAt == nil {
			t.Fatalf("end task: %+v %v", ended, err)
		}
		for _, sb := range []*corral.Sandbox{a, b} {
			if got := waitEnded(t, c, sb.ID); got.EndReason != "task_ended" {
				t.Fatalf("sandbox %s end reason %q, want task_ended", sb.ID, got.EndReason)
			}
		}
		if status, r := restExec(t, env.url, env.key, a.ID, "echo late"); status != 403 || r.Code != corral.CodeTaskEnded {
			t.Fatalf("exec after the task ended: %d %+v; want 403 task_ended", status, r)
		}
		_, err = a.Run(ctx, "echo late", corral.RunOptions{Timeout: time.Minute})
		if code, _ := apiCode(err); code != corral.CodeTaskEnded {
			t.Fatalf("SDK call after the task ended: %v; want task_ended", err)
		}
		_, err = c.Create(ctx, corral.CreateOptions{Task: task.ID})
		if code, _ := apiCode(err); code != corral.CodeTaskEnded {
			t.Fatalf("create in an ended task: %v; want task_ended", err)
		}
		_, err = c.ReportTokens(ctx, task.ID, 1)
		if code, _ := apiCode(err); code != corral.CodeTaskEnded {
			t.Fatalf("tokens for an ended task: %v; want task_ended", err)
		}
		if findEvent(audit(t, c, corral.AuditQuery{Task: task.ID, Kind: "task.ended"}), "task.ended", "") == nil {
			t.Error("no task.ended event")
		}
	})
}

// TestAdmission proves admission control on dedicated servers limited to
// two sandboxes (globally and per agent). Without a queue a third create
// is refused at once with 429 capacity_exceeded and a Retry-After of at
// least a second, and succeeds once a sandbox is killed. With a 20 s
// queue a third create is held (neither admitted nor refused while both
// slots are taken) and admitted once one is killed; a create that finds
// no slot for the whole queue timeout is refused with capacity_exceeded.
func TestAdmission(t *testing.T) {
	need(t)
	ctx := context.Background()
	limits := govern.AdmissionConfig{MaxConcurrent: 2, MaxPerAgent: 2, AgentRate: 100, AgentBurst: 100}

	t.Run("refuse", func(t *testing.T) {
		s := startGovServer(t, "admission", func(c *server.Config) { c.Admission = limits })
		a := newTaskSandbox(t, s.c, corral.CreateOptions{Agent: "alpha"})
		newTaskSandbox(t, s.c, corral.CreateOptions{Agent: "alpha"})
		var e apiErr
		status, hdr, body := rest(t, s.url, s.key, "POST", "/v1/sandboxes", map[string]any{"agent": "alpha"}, &e)
		if status != 429 || e.Code != corral.CodeCapacityExceeded {
			t.Fatalf("third create: %d %s; want 429 capacity_exceeded", status, body)
		}
		if ra, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || ra < 1 {
			t.Fatalf("Retry-After %q on a capacity refusal", hdr.Get("Retry-After"))
		}
		// Another agent meets the global limit, through the SDK.
		_, err := s.c.Create(ctx, corral.CreateOptions{Agent: "beta"})
		var ae *corral.APIError
		if !corral.IsCapacityExceeded(err) || !errors.As(err, &ae) || ae.RetryAfter < time.Second {
			t.Fatalf("create by another agent: %v; want capacity_exceeded with a Retry-After", err)
		}
		if list, err := s.c.List(ctx, corral.ListOptions{}); err != nil || len(list) != 2 {
			t.Fatalf("running sandboxes after the refusals: %d %v", len(list), err)
		}
		if err := a.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		c := newTaskSandbox(t, s.c, corral.CreateOptions{Agent: "alpha"})
		if res, err := c.Run(ctx, "echo in", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "in\n" {
			t.Fatalf("sandbox admitted after the kill: %+v %v", res, err)
		}
	})

	t.Run("queue", func(t *testing.T) {
		queued := limits
		queued.QueueTimeout = 20 * time.Second
		s := startGovServer(t, "admission-queue", func(c *server.Config) { c.Admission = queued })
		a := newTaskSandbox(t, s.c, corral.CreateOptions{Agent: "alpha"})
		newTaskSandbox(t, s.c, corral.CreateOptions{Agent: "alpha"})

		type result struct {
			sb  *corral.Sandbox
			err error
		}
		done := make(chan result, 1)
		sent := make(chan struct{})
		var once sync.Once
		go func() {
			trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(sent) }) }}
			sb, err := s.c.Create(httptrace.WithClientTrace(ctx, trace), corral.CreateOptions{Agent: "alpha", Timeout: 10 * time.Minute})
			done <- result{sb, err}
		}()
		t.Cleanup(func() {
			select {
			case r := <-done:
				if r.sb != nil {
					_, _ = s.c.Kill(context.Background(), r.sb.ID)
				}
			case <-time.After(time.Minute):
			}
		})
		select {
		case <-sent:
		case <-time.After(time.Minute):
			t.Fatal("the third create was never sent")
		}
		// Held: while both slots are taken it is neither admitted nor
		// refused (the window only gives the server time to answer
		// wrongly; it bounds nothing).
		select {
		case r := <-done:
			done <- r
			t.Fatalf("third create answered while both slots were taken: %+v %v", r.sb, r.err)
		case <-time.After(3 * time.Second):
		}
		if err := a.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		var r result
		select {
		case r = <-done:
			done <- r
		case <-time.After(2 * time.Minute):
			t.Fatal("the queued create was not admitted after a slot was freed")
		}
		if r.err != nil || r.sb.State != corral.StateRunning {
			t.Fatalf("queued create: %+v %v", r.sb, r.err)
		}
		if res, err := r.sb.Run(ctx, "echo queued", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "queued\n" {
			t.Fatalf("queued sandbox: %+v %v", res, err)
		}
		// Full again: a create waits out the queue timeout, then is refused.
		var e apiErr
		status, hdr, body := rest(t, s.url, s.key, "POST", "/v1/sandboxes", map[string]any{"agent": "alpha"}, &e)
		if status != 429 || e.Code != corral.CodeCapacityExceeded || !strings.Contains(e.Message, "after waiting") || hdr.Get("Retry-After") == "" {
			t.Fatalf("create with the queue timing out: %d %s (Retry-After %q)", status, body, hdr.Get("Retry-After"))
		}
	})
}

// metricsJSON is the answer of GET /v1/sandboxes/{id}/metrics.
type metricsJSON struct {
	Current *struct {
		Time        string  `json:"time"`
		CPUSeconds  float64 `json:"cpu_seconds"`
		MemoryBytes int64   `json:"memory_bytes"`
		Pids        int64   `json:"pids"`
	} `json:"current"`
	Series []struct {
		Time        time.Time `json:"time"`
		CPUPercent  float64   `json:"cpu_percent"`
		MemoryBytes int64     `json:"memory_bytes"`
	} `json:"series"`
	Limits struct {
		CPU         float64 `json:"cpu"`
		MemoryBytes int64   `json:"memory_bytes"`
		DiskBytes   int64   `json:"disk_bytes"`
		Pids        int64   `json:"pids"`
	} `json:"limits"`
}

// TestWatchdog proves the watchdog on a dedicated server whose CPU
// runaway limit is 3 s: a busy loop in a 0.5-CPU sandbox gets it killed
// with end reason cpu_runaway and a watchdog.cpu_runaway event; a
// sandbox holding ~80% of its memory limit gets watchdog.memory_high and
// keeps running; /metrics returns the current sample, a series that
// grows and the limits; /processes lists a background `sleep 300` as
// user "user", under the agent, which runs as root.
func TestWatchdog(t *testing.T) {
	need(t)
	s := startGovServer(t, "watchdog", func(c *server.Config) {
		c.Watchdog = watchdog.Config{CPURunawayFor: 3 * time.Second}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	t.Run("cpu runaway", func(t *testing.T) {
		sb := newTaskSandbox(t, s.c, corral.CreateOptions{Resources: corral.Resources{CPU: 0.5}})
		if _, err := sb.Start(ctx, "while :; do :; done", corral.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if ended := waitEnded(t, s.c, sb.ID); ended.EndReason != "cpu_runaway" {
			t.Fatalf("end reason %q, want cpu_runaway", ended.EndReason)
		}
		evs := audit(t, s.c, corral.AuditQuery{Sandbox: sb.ID})
		ev := findEvent(evs, "watchdog.cpu_runaway", sb.ID)
		if ev == nil {
			t.Fatalf("no watchdog.cpu_runaway event:\n%s", eventKinds(evs))
		}
		// At its quota (value near 50) or, on a busy host, starved below
		// it while demanding a whole core (demand near 100).
		var d struct{ Value, Limit, Demand float64 }
		if err := json.Unmarshal(ev.Data, &d); err != nil || d.Limit != 50 || (d.Value < 45 && d.Demand < 90) {
			t.Fatalf("watchdog.cpu_runaway data %s %v", ev.Data, err)
		}
	})

	t.Run("memory high and metrics", func(t *testing.T) {
		const limit = 256 << 20
		sb := newTaskSandbox(t, s.c, corral.CreateOptions{Resources: corral.Resources{CPU: 1, MemoryMB: 256}})
		if _, err := sb.Start(ctx, `python3 -c 'import time; a = b"x" * (205 << 20); print("holding", flush=True); time.sleep(600)'`, corral.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		ev := waitEvent(t, s.c, corral.AuditQuery{Sandbox: sb.ID}, "watchdog.memory_high")
		var d struct{ Value, Limit float64 }
		if err := json.Unmarshal(ev.Data, &d); err != nil || d.Limit != limit || d.Value < 0.8*limit {
			t.Fatalf("watchdog.memory_high data %s %v", ev.Data, err)
		}
		var m metricsJSON
		metrics := func() metricsJSON {
			m = metricsJSON{}
			if status, _, body := rest(t, s.url, s.key, "GET", "/v1/sandboxes/"+sb.ID+"/metrics", nil, &m); status != 200 {
				t.Fatalf("metrics: %d %s", status, body)
			}
			return m
		}
		waitFor(t, "3 samples in the metrics series", time.Minute, func() bool { return len(metrics().Series) >= 3 })
		n := len(m.Series)
		waitFor(t, "the metrics series to grow", time.Minute, func() bool { return len(metrics().Series) > n })
		if m.Current == nil || float64(m.Current.MemoryBytes) < 0.8*limit || m.Current.Pids < 2 {
			t.Fatalf("current sample %+v; want the memory held and the processes", m.Current)
		}
		if m.Limits.CPU != 1 || m.Limits.MemoryBytes != limit || m.Limits.DiskBytes <= 0 || m.Limits.Pids <= 0 {
			t.Fatalf("limits %+v", m.Limits)
		}
		for i := 1; i < len(m.Series); i++ {
			if !m.Series[i].Time.After(m.Series[i-1].Time) {
				t.Fatalf("series not in time order at %d: %v then %v", i, m.Series[i-1].Time, m.Series[i].Time)
			}
		}
		if got, err := s.c.Get(ctx, sb.ID); err != nil || got.State != corral.StateRunning {
			t.Fatalf("a memory warning ended the sandbox: %+v %v", got, err)
		}
	})

	t.Run("processes", func(t *testing.T) {
		sb := newTaskSandbox(t, s.c, corral.CreateOptions{})
		if _, err := sb.Start(ctx, "sleep 300", corral.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		var ps []hostProcess
		// The sleep itself, not the login shell that starts it (or one of
		// its short-lived subshells, which carry the same command line).
		isSleep := func(p hostProcess) bool { return p.Command == "sleep 300" }
		var sleep *hostProcess
		waitFor(t, "sleep 300 in the process list", time.Minute, func() bool {
			ps = processesOf(t, s.url, s.key, sb.ID)
			for i := range ps {
				if isSleep(ps[i]) {
					sleep = &ps[i]
					return true
				}
			}
			return false
		})
		agent := findProcess(ps, "/.corral/agent agent")
		if agent == nil || agent.User != "root" || agent.UID != 0 {
			t.Fatalf("agent process %+v in %+v; want it as root", agent, ps)
		}
		if sleep.User != "user" || sleep.UID != 1000 || sleep.Pid <= 0 {
			t.Fatalf("sleep process %+v; want user \"user\"", sleep)
		}
		// The tree: sleep descends from the agent.
		byPid := map[int]hostProcess{}
		for _, p := range ps {
			byPid[p.Pid] = p
		}
		p, ok := *sleep, true
		for hops := 0; ok && p.Pid != agent.Pid && hops < len(ps); hops++ {
			p, ok = byPid[p.PPid]
		}
		if !ok || p.Pid != agent.Pid {
			t.Fatalf("sleep (pid %d) does not descend from the agent (pid %d): %+v", sleep.Pid, agent.Pid, ps)
		}
		if !pidAlive(sleep.Pid, "sleep") {
			t.Fatalf("host pid %d of sleep is not a sleep on the host", sleep.Pid)
		}
	})
}

// TestDrill proves that `corral drill` against the shared server reports
// every brake as held: it exits 0 and prints eight HELD lines, one per
// drill.
func TestDrill(t *testing.T) {
	need(t)
	out, stderr, code := corralAt(t, env.url, env.key, []string{"drill"})
	held := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "HELD") {
			held++
		}
	}
	if code != 0 || held != 8 || strings.Contains(out, "FAILED") {
		t.Fatalf("corral drill: exit %d, %d HELD lines\nstdout:\n%s\nstderr:\n%s", code, held, out, stderr)
	}
	for _, name := range []string{"loop", "memory", "forkbomb", "disk", "egress", "envsecret", "loopagent", "budget"} {
		if !strings.Contains(out, " "+name+" ") {
			t.Errorf("drill %s missing from the report:\n%s", name, out)
		}
	}
}

// TestCrashRecovery proves that the control plane survives kill -9. A
// `corral serve` process runs two networked sandboxes, each with a
// `sleep 600` started in the background, and is killed with SIGKILL: the
// sandboxes' processes live on. While it is down one sandbox is killed
// with runc. On restart the living sandbox is adopted (running, its
// files and its sleep intact, commands work) and the dead one is ended
// as orphaned with nothing of it left on the host; the audit log still
// holds sandbox.created and the command events from before the crash
// and records sandbox.adopted and the orphan's end. Then the adopted
// sandbox is killed and the server stopped with SIGTERM: no runc
// container, mount, cgroup, state dir, veth or nftables table of that
// data dir remains.
func TestCrashRecovery(t *testing.T) {
	need(t)
	ctx := context.Background()
	tmp := t.TempDir()
	for d := tmp; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711) // sandbox root must traverse to its rootfs
	}
	data := filepath.Join(tmp, "data")
	addr := freeAddr(t)
	args := []string{"--sandbox-net", freeRange(t).String(), "--kill-grace", "1s"}
	var cur *serveProc
	t.Cleanup(func() {
		if cur != nil && cur.running() {
			_ = cur.signal(t, syscall.SIGKILL)
		}
		if t.Failed() && cur != nil {
			t.Logf("corral serve log (tail):\n%s", logTail(cur.log.String(), 60))
		}
		if len(hostHolds(t, data)) > 0 {
			// Leave nothing behind: a server that adopts everything and
			// kills it on the way out.
			p := startServe(t, data, addr, append(args, "--kill-on-shutdown")...)
			_ = p.signal(t, syscall.SIGTERM)
		}
	})

	cur = startServe(t, data, addr, args...)
	key := cur.key
	c := corral.New(cur.url, key)
	opts := corral.CreateOptions{Network: "allow", Allow: []string{"allowed.invalid"}, Timeout: 15 * time.Minute, Agent: "crash"}
	keep, err := c.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := c.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := keep.Run(ctx, "echo before-crash > /tmp/marker", corral.RunOptions{Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("command before the crash: %+v %v", res, err)
	}
	if res, err := lost.Run(ctx, "echo lost-before-crash", corral.RunOptions{Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("command before the crash: %+v %v", res, err)
	}
	sctx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	sleeps := map[string]int{}
	for _, sb := range []*corral.Sandbox{keep, lost} {
		if _, err := sb.Start(sctx, "sleep 600", corral.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "sleep 600 in "+sb.ID, time.Minute, func() bool {
			p := findProcess(processesOf(t, cur.url, key, sb.ID), "sleep 600")
			if p != nil {
				sleeps[sb.ID] = p.Pid
			}
			return p != nil
		})
	}
	tag := instanceTagOf(data)
	for _, sb := range []*corral.Sandbox{keep, lost} {
		if err := exec.Command("ip", "link", "show", vethName(tag, sb.ID)).Run(); err != nil {
			t.Fatalf("veth %s of %s not found before the crash: %v", vethName(tag, sb.ID), sb.ID, err)
		}
	}

	// Crash the control plane in the middle of two commands.
	if err := cur.signal(t, syscall.SIGKILL); !strings.Contains(fmt.Sprint(err), "killed") {
		t.Fatalf("corral serve after SIGKILL: %v", err)
	}
	for id, pid := range sleeps {
		if !pidAlive(pid, "sleep 600") {
			t.Fatalf("sleep 600 of %s (host pid %d) died with the control plane", id, pid)
		}
	}
	if out, err := exec.Command("runc", "--root", runcRoot(data), "state", keep.ID).Output(); err != nil || !strings.Contains(string(out), `"running"`) {
		t.Fatalf("runc state of %s after the crash: %s %v", keep.ID, out, err)
	}
	stopStreams()
	// While the server is down, one sandbox dies.
	if out, err := exec.Command("runc", "--root", runcRoot(data), "kill", lost.ID, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	waitFor(t, "the lost sandbox to stop", time.Minute, func() bool {
		out, _ := exec.Command("runc", "--root", runcRoot(data), "state", lost.ID).Output()
		return !strings.Contains(string(out), `"running"`)
	})

	cur = startServe(t, data, addr, args...)
	if cur.key != key {
		t.Fatal("admin key changed across the crash")
	}
	c = corral.New(cur.url, key)
	got, err := c.Get(ctx, keep.ID)
	if err != nil || got.State != corral.StateRunning {
		t.Fatalf("surviving sandbox after the restart: %+v %v", got, err)
	}
	if res, err := got.Run(ctx, "cat /tmp/marker", corral.RunOptions{Timeout: time.Minute}); err != nil || res.Stdout != "before-crash\n" {
		t.Fatalf("adopted sandbox: %+v %v", res, err)
	}
	if p := findProcess(processesOf(t, cur.url, key, keep.ID), "sleep 600"); p == nil || p.Pid != sleeps[keep.ID] {
		t.Fatalf("sleep 600 of the adopted sandbox: %+v, want host pid %d", p, sleeps[keep.ID])
	}
	got, err = c.Get(ctx, lost.ID)
	if err != nil || got.State != corral.StateEnded || got.EndReason != "orphaned" {
		t.Fatalf("lost sandbox after the restart: %+v %v", got, err)
	}
	if pidAlive(sleeps[lost.ID], "sleep 600") {
		t.Fatalf("sleep 600 of the orphan (host pid %d) still runs", sleeps[lost.ID])
	}
	var orphanLeft []string
	for _, h := range hostHolds(t, data, lost.ID) {
		if strings.Contains(h, lost.ID) || strings.Contains(h, vethName(tag, lost.ID)) {
			orphanLeft = append(orphanLeft, h)
		}
	}
	if len(orphanLeft) > 0 {
		t.Errorf("the orphan left on the host after the restart:\n%s", strings.Join(orphanLeft, "\n"))
	}

	// The audit log survived and says what happened.
	evs := audit(t, c, corral.AuditQuery{Team: "all"})
	created, adopted := findEvent(evs, "sandbox.created", keep.ID), findEvent(evs, "sandbox.adopted", keep.ID)
	if created == nil || adopted == nil || created.ID > adopted.ID {
		t.Fatalf("audit lacks sandbox.created before sandbox.adopted of %s:\n%s", keep.ID, eventKinds(evs))
	}
	before := false
	for _, e := range evs {
		if e.Kind == "command" && e.Sandbox == keep.ID && e.ID < adopted.ID && strings.Contains(string(e.Data), "before-crash") {
			before = true
		}
	}
	if !before {
		t.Fatalf("the command event from before the crash is missing:\n%s", eventKinds(evs))
	}
	orphanEnd := findEvent(evs, "sandbox.ended", lost.ID)
	if orphanEnd == nil || !strings.Contains(string(orphanEnd.Data), `"orphaned"`) || findEvent(evs, "sandbox.created", lost.ID) == nil {
		t.Fatalf("audit lacks the orphan's creation or its end as orphaned:\n%s", eventKinds(evs))
	}
	// The restart knew it followed a crash: server.started says so and
	// server.recovered follows the reconciliation.
	var started *corral.Event
	for i := range evs {
		if evs[i].Kind == "server.started" {
			started = &evs[i] // the last one is this run's
		}
	}
	recovered := findEvent(evs, "server.recovered", "")
	if started == nil || !strings.Contains(string(started.Data), `"after_crash":true`) || recovered == nil || recovered.ID < adopted.ID {
		t.Fatalf("audit lacks server.started after a crash and server.recovered after the adoption:\n%s", eventKinds(evs))
	}
	t.Logf("recovered: %s adopted (sleep pid %d kept), %s orphaned; %s", keep.ID, sleeps[keep.ID], lost.ID, recovered.Data)
	// The commands cut off by the crash are closed with a reason and an
	// audit event says so: no record claims a command still runs.
	for _, id := range []string{keep.ID, lost.ID} {
		_, _, body := rest(t, cur.url, key, "GET", "/v1/sandboxes/"+id+"/commands", nil, nil)
		if strings.Contains(string(body), `"ended_at":null`) || !strings.Contains(string(body), "control_plane_restarted") {
			t.Fatalf("commands of %s after the restart still open or without a reason: %s", id, body)
		}
		if findEvent(evs, "command.interrupted", id) == nil {
			t.Fatalf("no command.interrupted event for %s:\n%s", id, eventKinds(evs))
		}
	}

	// Clean end: kill the adopted sandbox, stop the server with SIGTERM.
	// First, the census sees the adopted sandbox (so that an empty one
	// below means something): its container, its mounts, its veth.
	held := strings.Join(hostHolds(t, data, keep.ID), "\n")
	for _, want := range []string{"runc container " + keep.ID, "link " + vethName(tag, keep.ID), "cgroup /corral/" + keep.ID, "mount "} {
		if !strings.Contains(held, want) {
			t.Fatalf("the host census does not see %q of the adopted sandbox:\n%s", want, held)
		}
	}
	if _, err := c.Kill(ctx, keep.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sleep 600 of the killed sandbox to go", time.Minute, func() bool { return !pidAlive(sleeps[keep.ID], "sleep 600") })
	if err := cur.signal(t, syscall.SIGTERM); err.Error() != "exit status 0" {
		t.Fatalf("corral serve after SIGTERM: %v\n%s", err, logTail(cur.log.String(), 40))
	}
	if left := hostHolds(t, data, keep.ID, lost.ID); len(left) > 0 {
		t.Fatalf("left on the host after a clean stop:\n%s", strings.Join(left, "\n"))
	}
	for _, id := range []string{keep.ID, lost.ID} {
		if cgroups.Open("/corral/" + id).Exists() {
			t.Fatalf("cgroup of %s left", id)
		}
	}
}
