package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary is its own supervisor binary: run as `BIN supervisor
// --socket PATH` (what Client starts), it serves PATH.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "supervisor" && os.Args[2] == "--socket" {
		os.Exit(Serve(os.Args[3], 300*time.Millisecond))
	}
	os.Exit(m.Run())
}

func newClient(t *testing.T) *Client {
	dir := t.TempDir()
	c := &Client{Socket: filepath.Join(dir, "sup", "supervisor.sock"), Binary: os.Args[0]}
	// Orphaned by this process's exit, an idle supervisor would stay.
	t.Cleanup(func() {
		if err := c.CloseWait(time.Minute); err != nil {
			t.Error(err)
		}
		poll(t, "the supervisor exits", func() bool { return len(pidsServing(c.Socket)) == 0 })
	})
	return c
}

// TestRunReapsOrphans: a command runs under the supervisor with the
// given output and its exit code comes back; a process it leaves behind
// (an orphan, as a runtime's create leaves the sandbox's init) is
// reparented to the supervisor and reaped by it, never left a zombie;
// with nothing left to reap the supervisor exits on its own and takes
// its socket directory with it. It defends the density change that runs
// every sandbox without a resident process of its own.
func TestRunReapsOrphans(t *testing.T) {
	c := newClient(t)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	code, err := c.Run(context.Background(), []string{"/bin/sh", "-c", "echo hi; echo err >&2; sleep 1 & exit 3"}, out)
	if err != nil || code != 3 {
		t.Fatalf("run: code %d, %v; want 3", code, err)
	}
	out.Close()
	if b, _ := os.ReadFile(out.Name()); string(b) != "hi\nerr\n" {
		t.Fatalf("output %q", b)
	}
	sup := pidsServing(c.Socket)
	if len(sup) != 1 {
		t.Fatalf("supervisors serving %s: %v", c.Socket, sup)
	}
	// The orphaned sleep is the supervisor's child now.
	poll(t, "the orphan is reparented to the supervisor", func() bool { return len(children(sup[0], "")) > 0 })
	poll(t, "the orphan is reaped", func() bool { return len(children(sup[0], "")) == 0 })
	poll(t, "the idle supervisor exits", func() bool { return len(pidsServing(c.Socket)) == 0 })
	if _, err := os.Stat(filepath.Dir(c.Socket)); !os.IsNotExist(err) {
		t.Fatalf("socket dir left after the supervisor exited: %v", err)
	}
	// The exited supervisor is this process's child, reaped by the
	// client's Wait shortly after it exits: poll, never a zombie left.
	poll(t, "no zombie is left to this process", func() bool { return len(children(os.Getpid(), "Z")) == 0 })
	// Asked again, a new supervisor is started.
	out, _ = os.Create(filepath.Join(t.TempDir(), "out2"))
	defer out.Close()
	if code, err := c.Run(context.Background(), []string{"/bin/true"}, out); err != nil || code != 0 {
		t.Fatalf("run after the supervisor exited: %d, %v", code, err)
	}
}

// TestCloseExitsOnlyIfIdle: Close ends a supervisor with nothing to reap
// at once (a control plane that shuts down must not leave it behind),
// but not one that still has a process to reap (a sandbox kept across
// a restart).
func TestCloseExitsOnlyIfIdle(t *testing.T) {
	c := newClient(t)
	out, _ := os.Create(filepath.Join(t.TempDir(), "out"))
	defer out.Close()
	if _, err := c.Run(context.Background(), []string{"/bin/sh", "-c", "sleep 2 & exit 0"}, out); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(pidsServing(c.Socket)) != 1 {
		t.Fatal("Close ended a supervisor that still had a process to reap")
	}
	if err := c.CloseWait(time.Minute); err != nil {
		t.Fatal(err)
	}
	poll(t, "the supervisor exits once idle and asked", func() bool { return len(pidsServing(c.Socket)) == 0 })
}

// TestRefusesBadRequests: a request without its output descriptor, or
// with no command, is refused and runs nothing.
func TestRefusesBadRequests(t *testing.T) {
	c := newClient(t)
	if err := c.Close(); err != nil { // none running: not an error
		t.Fatal(err)
	}
	out, _ := os.Create(filepath.Join(t.TempDir(), "out"))
	defer out.Close()
	if _, err := c.Run(context.Background(), []string{"/bin/true"}, out); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "x")
	for _, tc := range []struct{ name, req, reply string }{
		{"no descriptor", `{"argv":["/bin/touch","` + marker + `"]}`, "without its output descriptor"},
		{"no command", `{"argv":[]}`, "a command or exit_if_idle"},
		{"not JSON", `{"argv":`, "bad request"},
	} {
		conn, err := c.connect()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(frame([]byte(tc.req))); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		n, _ := conn.Read(buf)
		conn.Close()
		if !bytes.Contains(buf[:n], []byte(tc.reply)) {
			t.Errorf("%s: reply %q, want %q", tc.name, buf[:n], tc.reply)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a refused request ran its command: %v", err)
	}
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not so after a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pidsServing lists the supervisor processes serving sock.
func pidsServing(sock string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 4 && args[1] == "supervisor" && args[3] == sock {
			if st := state(pid); st != "Z" && st != "" {
				out = append(out, pid)
			}
		}
	}
	return out
}

// children lists the children of ppid in state st ("" for any).
func children(ppid int, st string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) && (st == "" || f[0] == st) {
			out = append(out, pid)
		}
	}
	return out
}

func state(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[0]
}

// TestRefusesOtherUsers: a client that is not the supervisor's user is
// refused and nothing runs, even if the socket's modes let it connect.
// The supervisor runs commands as root: any other host user who reached
// it would run commands as root. (The socket's directory is private to
// root as well; this checks the peer-credential lock behind it.)
func TestRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the client runs as nobody")
	}
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("needs /usr/bin/python3 for a client of another uid")
	}
	c := newClient(t)
	out, _ := os.Create(filepath.Join(t.TempDir(), "out"))
	defer out.Close()
	// An orphan to reap keeps the supervisor serving while the client
	// of another uid starts (an idle one exits after 300 ms here).
	if _, err := c.Run(context.Background(), []string{"/bin/sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"}, out); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out.Name())
	orphan, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("orphan pid %q", b)
	}
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	// Open the way to the socket for everyone.
	for d := filepath.Dir(c.Socket); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(c.Socket, 0o777); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(os.TempDir(), fmt.Sprintf("corral-supervisor-test-%d", os.Getpid()))
	defer os.Remove(marker)
	script := `
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
body = json.dumps({"argv": ["/bin/touch", sys.argv[2]]}).encode()
try:
    socket.send_fds(s, [struct.pack(">I", len(body)) + body], [1])
except OSError:
    pass  # refused before the request was read
print(s.recv(512).decode())
`
	cmd := exec.Command("/usr/sbin/runuser", "-u", "nobody", "--", py, "-c", script, c.Socket, marker)
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as nobody: %v: %s", err, got)
	}
	if !strings.Contains(string(got), "peer uid 65534 refused") {
		t.Fatalf("reply to a client of uid 65534: %q", got)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the command of a refused client ran: %v", err)
	}
}

// TestRunTimedReportsRunTime: RunTimed reports how long the command ran
// as the supervisor saw it, so that a create's trace can tell the
// runtime's own time from the supervisor's round trip (the `runtime`
// and `supervisor` phases of docs/performance.md). A command that
// sleeps 200 ms ran at least that long, and never longer than the call
// took; without the report the runtime phase would be 0 and the
// supervisor's would hold the whole runtime.
func TestRunTimedReportsRunTime(t *testing.T) {
	c := newClient(t)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	t0 := time.Now()
	code, ran, err := c.RunTimed(context.Background(), []string{"/bin/sleep", "0.2"}, out)
	total := time.Since(t0)
	if err != nil || code != 0 {
		t.Fatalf("run: code %d, %v", code, err)
	}
	if ran < 200*time.Millisecond || ran > total {
		t.Fatalf("the command ran %v by the supervisor's report; want between 200ms and the call's %v", ran, total)
	}
}
