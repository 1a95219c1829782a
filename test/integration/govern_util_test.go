package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/testserver"
)

// Helpers of the brake tests (govern_test.go): dedicated servers, REST
// calls against any server, the CLI with explicit --server/--api-key, and
// waiting for sandboxes and audit events.

// govServer is a dedicated corral server of the brake tests: no network
// gateway (its sandboxes have no network), its log kept in a buffer.
type govServer struct {
	ts  *testserver.Server
	c   *corral.Client
	url string
	key string
	log *syncBuffer
}

// startGovServer starts a server with the configuration adjusted by
// configure; it is closed in t.Cleanup, which prints the log's tail if t
// failed.
func startGovServer(t *testing.T, name string, configure func(*server.Config)) *govServer {
	t.Helper()
	need(t)
	s := &govServer{log: &syncBuffer{}}
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) {
		c.NoNetwork = true
		c.Log = slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		if configure != nil {
			configure(c)
		}
	})
	if err != nil {
		t.Fatalf("start %s server: %v", name, err)
	}
	s.ts, s.url, s.key = ts, ts.URL, ts.Key
	s.c = corral.New(ts.URL, ts.Key)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s server log (tail):\n%s", name, logTail(s.log.String(), 60))
		}
		if err := ts.Close(); err != nil {
			t.Errorf("close %s server: %v", name, err)
		}
	})
	return s
}

// logTail returns the last n lines of a log.
func logTail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// sharedClient is an SDK client of the shared server.
func sharedClient(t *testing.T) *corral.Client {
	t.Helper()
	need(t)
	return corral.New(env.url, env.key)
}

// agentName is a fresh agent name, so that per-agent admission limits
// and rate buckets of one test never meet another's.
func agentName(what string) string {
	return fmt.Sprintf("gov-%s-%d", what, time.Now().UnixNano()%1_000_000_000)
}

// rest makes a REST request to the server at base, decodes a JSON answer
// into out (if any) and returns the status, the headers and the raw body.
func rest(t *testing.T, base, key, method, path string, body, out any) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, data, err)
		}
	}
	return resp.StatusCode, resp.Header, data
}

// execReply is a REST exec answer: a result, or an error with a code.
type execReply struct {
	execResult
	Warnings []string `json:"warnings"`
	Code     string   `json:"code"`
	Message  string   `json:"message"`
}

// restExec runs a shell command through POST /v1/sandboxes/{id}/exec and
// returns the status and the decoded answer (result or error).
func restExec(t *testing.T, base, key, id, command string) (int, execReply) {
	t.Helper()
	var r execReply
	status, _, _ := rest(t, base, key, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": command, "timeout": 60}, &r)
	return status, r
}

// corralAt runs the corral CLI against the server at base with explicit
// --server and --api-key flags (put right after the subcommand path, so
// that they precede positional arguments) and returns stdout, stderr and
// the exit code.
func corralAt(t *testing.T, base, key string, path []string, args ...string) (string, string, int) {
	t.Helper()
	argv := append(append(append([]string{}, path...), "--server", base, "--api-key", key), args...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.bin, argv...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CORRAL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("corral %v: %v", argv, err)
	}
	return out.String(), errb.String(), code
}

// newTaskSandbox creates a sandbox in a task and kills it in t.Cleanup.
func newTaskSandbox(t *testing.T, c *corral.Client, opts corral.CreateOptions) *corral.Sandbox {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Minute
	}
	sb, err := c.Create(context.Background(), opts)
	if err != nil {
		t.Fatalf("create sandbox (task %q): %v", opts.Task, err)
	}
	t.Cleanup(func() { _, _ = c.Kill(context.Background(), sb.ID) })
	if opts.Task != "" && sb.Task != opts.Task {
		t.Fatalf("sandbox %s is in task %q, want %q", sb.ID, sb.Task, opts.Task)
	}
	return sb
}

// waitEnded waits for a sandbox to end and returns its record.
func waitEnded(t *testing.T, c *corral.Client, id string) *corral.Sandbox {
	t.Helper()
	var got *corral.Sandbox
	waitFor(t, "sandbox "+id+" to end", 2*time.Minute, func() bool {
		sb, err := c.Get(context.Background(), id)
		if err == nil && sb.State == corral.StateEnded {
			got = sb
			return true
		}
		return false
	})
	return got
}

// audit returns the events of a query, failing the test on error.
func audit(t *testing.T, c *corral.Client, q corral.AuditQuery) []corral.Event {
	t.Helper()
	evs, err := c.Audit(context.Background(), q)
	if err != nil {
		t.Fatalf("audit %+v: %v", q, err)
	}
	return evs
}

// findEvent returns the first event of kind (of sandbox, if not "").
func findEvent(evs []corral.Event, kind, sandbox string) *corral.Event {
	for i := range evs {
		if evs[i].Kind == kind && (sandbox == "" || evs[i].Sandbox == sandbox) {
			return &evs[i]
		}
	}
	return nil
}

// waitEvent waits for an audit event of kind matching q and returns it.
func waitEvent(t *testing.T, c *corral.Client, q corral.AuditQuery, kind string) corral.Event {
	t.Helper()
	q.Kind = kind
	var ev corral.Event
	waitFor(t, "audit event "+kind, 2*time.Minute, func() bool {
		evs, err := c.Audit(context.Background(), q)
		if err != nil || len(evs) == 0 {
			return false
		}
		ev = evs[0]
		return true
	})
	return ev
}

// eventKinds lists the kinds of events, for failure messages.
func eventKinds(evs []corral.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "#%d %s sandbox=%s task=%s %s\n", e.ID, e.Kind, e.Sandbox, e.Task, e.Data)
	}
	return b.String()
}

// apiCode returns the code and status of an SDK error ("" if it is not
// an *corral.APIError).
func apiCode(err error) (string, int) {
	var ae *corral.APIError
	if errors.As(err, &ae) {
		return ae.Code, ae.Status
	}
	return "", 0
}

// ---------------------------------------------------------------------
// A corral server run as its own process (`corral serve`), for crashing.

// serveProc is a `corral serve` process.
type serveProc struct {
	cmd  *exec.Cmd
	log  *syncBuffer
	url  string
	key  string
	done chan struct{}
	exit atomic.Value // error from Wait
}

// startServe runs `corral serve --data data --listen addr extra...` and
// waits until it answers /healthz. The base template comes from the
// shared template cache (CORRAL_TEMPLATE_CACHE or its default).
func startServe(t *testing.T, data, addr string, extra ...string) *serveProc {
	t.Helper()
	return startServeURL(t, data, addr, "http://"+addr, http.DefaultClient, extra...)
}

// startServeURL is startServe for a server that answers on url (an
// https:// one for a server with --tls-cert), polled with hc.
func startServeURL(t *testing.T, data, addr, url string, hc *http.Client, extra ...string) *serveProc {
	t.Helper()
	// The uid range is recorded in copies of /etc's files, kept across
	// restarts of the same data dir.
	etc := data + ".etc"
	if _, err := os.Stat(etc); err != nil {
		if _, err := testserver.CopyIDFiles(etc); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"serve", "--data", data, "--listen", addr, "--id-files", etc}, extra...)
	p := &serveProc{log: &syncBuffer{}, url: url, done: make(chan struct{})}
	p.cmd = exec.Command(env.bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	// Its own process group: a signal meant for it reaches nothing else.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start corral serve: %v", err)
	}
	go func() {
		err := p.cmd.Wait()
		if err == nil {
			err = errors.New("exit status 0")
		}
		p.exit.Store(err)
		close(p.done)
	}()
	waitFor(t, "corral serve to answer /healthz", 5*time.Minute, func() bool {
		select {
		case <-p.done:
			t.Fatalf("corral serve exited: %v\n%s", p.exit.Load(), logTail(p.log.String(), 40))
		default:
		}
		resp, err := hc.Get(p.url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	key, err := os.ReadFile(filepath.Join(data, "admin.key"))
	if err != nil {
		t.Fatalf("admin key: %v", err)
	}
	p.key = strings.TrimSpace(string(key))
	return p
}

// running reports whether the process has not exited.
func (p *serveProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the server process and waits for it to exit; it
// returns what Wait said.
func (p *serveProc) signal(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if !p.running() {
		return p.exit.Load().(error)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal corral serve: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("corral serve did not exit after %v", sig)
	}
	return p.exit.Load().(error)
}

// freeAddr returns a free 127.0.0.1 TCP address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// instanceTagOf is the instance tag of a server's data dir (see
// internal/server): nftables table corral_TAG, interfaces crTAG....
func instanceTagOf(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return hex.EncodeToString(sum[:])[:5]
}

// vethName is the host-side interface of sandbox id (see internal/netns).
func vethName(tag, id string) string {
	sum := sha256.Sum256([]byte(id))
	return ("cr" + tag + hex.EncodeToString(sum[:]))[:15]
}

// hostHolds lists what the host still holds for a data dir (and, if ids
// are given, for those sandboxes): runc containers, mounts, cgroups,
// state dirs, network interfaces and the nftables table. Empty when
// nothing is left.
func hostHolds(t *testing.T, dataDir string, ids ...string) []string {
	t.Helper()
	var left []string
	out, err := exec.Command("runc", "--root", runcRoot(dataDir), "list", "-q").Output()
	if err != nil {
		// No state dir at all is fine: runc has nothing.
		if _, serr := os.Stat(runcRoot(dataDir)); serr == nil {
			t.Fatalf("runc list: %v", err)
		}
	}
	for _, id := range strings.Fields(string(out)) {
		left = append(left, "runc container "+id)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, dataDir) {
			left = append(left, "mount "+line)
		}
	}
	tag := instanceTagOf(dataDir)
	links, _ := exec.Command("ip", "-o", "link").Output()
	for _, line := range strings.Split(string(links), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], "cr"+tag) {
			left = append(left, "link "+f[1])
		}
	}
	if err := exec.Command("nft", "list", "table", "inet", "corral_"+tag).Run(); err == nil {
		left = append(left, "nftables table corral_"+tag)
	}
	for _, id := range ids {
		if cgroups.Open("/corral/" + id).Exists() {
			left = append(left, "cgroup /corral/"+id)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); err == nil {
			left = append(left, "state dir of "+id)
		}
	}
	return left
}

// pidAlive reports whether host pid runs a command line containing want
// (so that a reused pid does not count).
func pidAlive(pid int, want string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), want)
}

// hostProcess is an entry of GET /v1/sandboxes/{id}/processes.
type hostProcess struct {
	Pid        int     `json:"pid"`
	PPid       int     `json:"ppid"`
	UID        int     `json:"uid"`
	User       string  `json:"user"`
	CPUSeconds float64 `json:"cpu_seconds"`
	RSSBytes   int64   `json:"rss_bytes"`
	State      string  `json:"state"`
	Command    string  `json:"command"`
}

// processesOf lists a sandbox's processes as the host sees them.
func processesOf(t *testing.T, base, key, id string) []hostProcess {
	t.Helper()
	var out struct {
		Processes []hostProcess `json:"processes"`
	}
	if status, _, body := rest(t, base, key, "GET", "/v1/sandboxes/"+id+"/processes", nil, &out); status != 200 {
		t.Fatalf("processes of %s: %d %s", id, status, body)
	}
	return out.Processes
}

// findProcess returns the first process whose command contains want.
func findProcess(ps []hostProcess, want string) *hostProcess {
	for i := range ps {
		if strings.Contains(ps[i].Command, want) {
			return &ps[i]
		}
	}
	return nil
}
