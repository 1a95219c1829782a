package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"
	"github.com/rivo/uniseg"
	"golang.org/x/sys/unix"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestCLITop runs `corral top` against the real server with real
// sandboxes of a team: the plain snapshot (--once) lists the team's
// sandboxes with their CPU and memory, their task's agent, the totals
// with the tripped breaker, and the latest incidents (the breaker trip,
// a refused DNS query); another team's key sees none of it; an admin's
// --team sees it and a member's --team all is refused. An agent name
// with an escape sequence is refused at create; a sandbox's metadata
// carries a forged row after a carriage return and newline: the output
// holds no control character. Under a pseudo-terminal the interactive screen
// draws, follows a resize, and quits on q and on SIGTERM with the
// terminal's modes as they were before.
func TestCLITop(t *testing.T) {
	need(t)
	ctx := context.Background()
	keyA, keyB := teamKey(t, "top-alpha"), teamKey(t, "top-beta")
	ca := corral.New(env.url, keyA)

	const forged = "running  forged-row"
	// The server refuses escape sequences in agent names and metadata
	// (TestBadInputRefused); the CLI's own sanitiser against a hostile
	// server is TestCLITermSafeOutput. What still reaches top here is a
	// metadata value with a carriage return and a newline.
	if _, err := ca.CreateTask(ctx, corral.TaskOptions{Agent: "crawler\x1b]0;owned\x07", MaxCalls: 3}); err == nil || !strings.Contains(err.Error(), "invalid_argument") {
		t.Fatalf("task with an escape sequence in its agent name: %v, want invalid_argument", err)
	}
	task, err := ca.CreateTask(ctx, corral.TaskOptions{Agent: "crawler", MaxCalls: 3, OnTrip: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	sb1, err := ca.Create(ctx, corral.CreateOptions{Task: task.ID, Network: "allow", Allow: []string{"allowed-top.test"},
		Metadata: map[string]string{"owner": "alice", "note": "\r\n" + forged}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Kill(context.Background(), sb1.ID) })
	sb2, err := ca.Create(ctx, corral.CreateOptions{Metadata: map[string]string{"owner": "bob"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Kill(context.Background(), sb2.ID) })

	// A refused DNS query (the filter refuses an unlisted name without
	// asking any resolver), then tool calls until the task's breaker
	// opens.
	if r, err := ca.Exec(ctx, sb1.ID, corral.ExecRequest{Command: "getent hosts refused-top.test"}); err != nil || r.ExitCode != 2 {
		t.Fatalf("getent of an unlisted name: %+v %v, want exit 2", r, err)
	}
	tripped := false
	for i := 0; i < 6 && !tripped; i++ {
		_, err := ca.Exec(ctx, sb1.ID, corral.ExecRequest{Command: "true"})
		tripped = err != nil && strings.Contains(err.Error(), "budget_exhausted")
	}
	if !tripped {
		t.Fatal("the task's breaker did not open after its max_calls")
	}

	top := func(key string, args ...string) (string, string, int) {
		return cliAs(t, env.url, key, "", append([]string{"top", "--once"}, args...)...)
	}
	var out string
	waitFor(t, "corral top --once to show both sandboxes with samples, the breaker and the incidents", 60*time.Second, func() bool {
		o, errOut, code := top(keyA)
		if code != 0 {
			t.Fatalf("corral top --once: exit %d: %s", code, errOut)
		}
		out = o
		return strings.Contains(out, "2 running, 0 paused") && strings.Contains(out, "tripped breakers: 1") &&
			strings.Contains(out, "task.breaker_open") && strings.Contains(out, "refused refused-top.test") &&
			rowHasSample(out, sb1.ID) && rowHasSample(out, sb2.ID)
	})
	if bad := firstControl(out); bad != "" {
		t.Fatalf("corral top --once printed %s from the sandboxes' metadata or agent name:\n%q", bad, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, forged) {
			t.Fatalf("a forged row from metadata: %q", line)
		}
	}
	row1 := rowOf(out, sb1.ID)
	for _, want := range []string{"running", "base", "runc", "light", task.ID, "crawler", "owner=alice"} {
		if !strings.Contains(row1, want) {
			t.Errorf("row of %s lacks %q: %q", sb1.ID, want, row1)
		}
	}
	if !strings.Contains(rowOf(out, sb2.ID), "owner=bob") {
		t.Errorf("row of %s: %q", sb2.ID, rowOf(out, sb2.ID))
	}
	if o, _, code := top(keyA, "--filter", "owner=bob", "--sort", "mem"); code != 0 || rowOf(o, sb1.ID) != "" || rowOf(o, sb2.ID) == "" {
		t.Errorf("--filter owner=bob: exit %d\n%s", code, o)
	}

	// Another team sees none of it.
	o, errOut, code := top(keyB)
	if code != 0 || strings.Contains(o, sb1.ID) || strings.Contains(o, sb2.ID) || strings.Contains(o, task.ID) ||
		!strings.Contains(o, "0 running, 0 paused") || !strings.Contains(o, "tripped breakers: 0") || strings.Contains(o, "refused-top.test") {
		t.Errorf("team beta's corral top: exit %d %s\n%s", code, errOut, o)
	}
	// An admin may look at the team, or at every team; a member may not.
	if o, errOut, code := top(env.key, "--team", "top-alpha"); code != 0 || !strings.Contains(o, sb1.ID) || !strings.Contains(o, "tripped breakers: 1") {
		t.Errorf("admin --team top-alpha: exit %d %s\n%s", code, errOut, o)
	}
	if o, errOut, code := top(env.key, "--team", "all"); code != 0 || !strings.Contains(rowOf(o, sb1.ID), "top-alpha") {
		t.Errorf("admin --team all: exit %d %s\n%s", code, errOut, o)
	}
	if o, errOut, code := top(keyA, "--team", "all"); code == 0 || !strings.Contains(errOut, "forbidden") {
		t.Errorf("member --team all: exit %d, stderr %q, stdout %q; want a forbidden error", code, errOut, o)
	}
	if _, errOut, code := top(keyA, "--sort", "name"); code != 2 {
		t.Errorf("--sort name: exit %d %s, want 2", code, errOut)
	}

	t.Run("tty", func(t *testing.T) {
		for _, how := range []string{"q", "SIGTERM", "resize"} {
			t.Run(how, func(t *testing.T) { testTopTTY(t, keyA, how, sb1.ID) })
		}
	})
}

// testTopTTY runs the interactive corral top on a pseudo-terminal until
// it shows id, then ends it by how ("q", "SIGTERM", or a resize to 70
// columns followed by q), and checks that it drew on the alternate
// screen, that it left it, and that the terminal's modes are back.
func testTopTTY(t *testing.T, key, how, id string) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 160}); err != nil {
		t.Fatal(err)
	}
	before, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(env.bin, "top", "--interval", "250ms")
	cmd.Env = append(os.Environ(), "CORRAL_URL="+env.url, "CORRAL_API_KEY="+key)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var screen bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			screen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	seen := func() string { mu.Lock(); defer mu.Unlock(); return screen.String() }
	done := make(chan error, 1)
	exited := false
	defer func() {
		if !exited {
			cmd.Process.Kill()
			<-done
		}
	}()
	go func() { done <- cmd.Wait() }()
	waitFor(t, "corral top to draw the sandbox", 30*time.Second, func() bool { return strings.Contains(seen(), id) })

	switch how {
	case "q":
		ptmx.Write([]byte("q"))
	case "SIGTERM":
		cmd.Process.Signal(syscall.SIGTERM)
	case "resize":
		mark := len(seen())
		if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 20, Cols: 70}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a frame drawn for 70 columns", 30*time.Second, func() bool {
			frame, ok := lastFrame(seen()[mark:])
			if !ok {
				return false
			}
			for _, l := range frame {
				if uniseg.StringWidth(l) > 70 {
					return false
				}
			}
			return len(frame) <= 20
		})
		ptmx.Write([]byte("q"))
	}
	select {
	case err := <-done:
		exited = true
		if err != nil {
			t.Fatalf("corral top ended with %v:\n%q", err, seen())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("corral top did not end after %s:\n%q", how, seen())
	}
	// The test holds the terminal open, so its output is read on after
	// the exit: poll for the last bytes.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasSuffix(seen(), "\x1b[?25h\x1b[?1049l") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	out := seen()
	if !strings.Contains(out, "\x1b[?1049h") || !strings.HasSuffix(out, "\x1b[?25h\x1b[?1049l") {
		t.Errorf("the alternate screen was not entered and left (end of output %q)", out[max(0, len(out)-200):])
	}
	after, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if after.Iflag != before.Iflag || after.Oflag != before.Oflag || after.Lflag != before.Lflag || after.Cflag != before.Cflag {
		t.Errorf("terminal modes not restored: before %+v, after %+v", before, after)
	}
}

// lastFrame returns the lines of the last complete frame in s (from a
// cursor-home to the erase-below that ends it), without corral top's
// own highlighting and erase-line sequences.
func lastFrame(s string) ([]string, bool) {
	end := strings.LastIndex(s, "\x1b[J")
	if end < 0 {
		return nil, false
	}
	start := strings.LastIndex(s[:end], "\x1b[H")
	if start < 0 {
		return nil, false
	}
	f := s[start+len("\x1b[H") : end]
	f = strings.NewReplacer("\x1b[7m", "", "\x1b[0m", "", "\x1b[K", "").Replace(f)
	return strings.Split(f, "\r\n"), true
}

// rowOf returns the line of out that shows sandbox id ("" when none).
func rowOf(out, id string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, id) && !strings.HasPrefix(l, " ") { // incident lines are indented
			return l
		}
	}
	return ""
}

// rowHasSample reports whether the row of id shows a CPU percentage and
// a memory figure (the list's current sample), not "-".
func rowHasSample(out, id string) bool {
	f := strings.Fields(rowOf(out, id))
	for i, s := range f {
		if s == id && i+7 < len(f) {
			// STATE ID TEMPLATE RUNTIME TIER AGE LEFT CPU% MEM
			cpu, mem := f[i+6], f[i+7]
			return cpu != "-" && mem != "-" && strings.Contains(mem, "/")
		}
	}
	return false
}

// firstControl names the first control character or escape in s other
// than a newline, or "".
func firstControl(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		if r == '\n' {
			continue
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			return fmt.Sprintf("%U", r)
		}
	}
	return ""
}
