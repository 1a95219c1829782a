package integration

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var asRoot = map[string]any{"user": "root"}

// TestRunDirIsCapped: the agent's socket directory (/run/corral) is a
// 64 KiB tmpfs of its own on the host. Before, it was a directory on the
// host's data disk writable by sandbox root: `dd of=/run/corral/x` wrote
// 200 MiB from a sandbox with a 50 MiB disk. Now the write fails with
// ENOSPC, the host copy is at most 64 KiB, files run out of inodes, and
// the mount goes with the sandbox.
func TestRunDirIsCapped(t *testing.T) { eachRuntime(t, testRunDirIsCapped) }

func testRunDirIsCapped(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt, "resources": map[string]any{"disk_mb": 50}})
	host := filepath.Join(env.dataDir, "sandboxes", id, "run")
	res := sh(t, id, "dd if=/dev/zero of=/run/corral/x bs=1M count=200", asRoot)
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("dd to /run/corral as root: exit %d, stderr %q; want ENOSPC", res.ExitCode, res.Stderr)
	}
	fi, err := os.Stat(filepath.Join(host, "x"))
	if err != nil {
		t.Fatalf("the write did not reach the host directory: %v", err)
	}
	if fi.Size() > 64<<10 {
		t.Fatalf("sandbox root wrote %d bytes to the host through /run/corral", fi.Size())
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(host, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC || uint64(fs.Blocks)*uint64(fs.Bsize) > 64<<10 {
		t.Fatalf("host side of /run/corral: fs type %#x, %d bytes; want a tmpfs of at most 64 KiB", fs.Type, uint64(fs.Blocks)*uint64(fs.Bsize))
	}
	mustSh(t, id, "rm /run/corral/x", asRoot)
	res = sh(t, id, "for i in $(seq 64); do touch /run/corral/f$i || exit 1; done", asRoot)
	if res.ExitCode == 0 {
		t.Fatal("sandbox root created 64 files in /run/corral; want it out of inodes")
	}
	mustSh(t, id, "rm -f /run/corral/f*", asRoot)
	if out := mustSh(t, id, "echo alive"); out != "alive\n" {
		t.Fatalf("agent after the fill: %q", out)
	}
	call(t, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), host) {
		t.Fatalf("%s is still mounted after the kill", host)
	}
}

// TestAgentTokenNotReadable: sandbox root cannot read the agent's access
// token. Before, `sudo cat /run/corral/token` printed it. Now the agent
// removes the file before it serves, and the agent's memory is closed to
// sandbox root (the agent is non-dumpable and sandbox root has no
// CAP_SYS_PTRACE); what it can read of the agent (its command line, and
// under gVisor its environment and maps) does not hold the token. The
// agent still requires the token.
func TestAgentTokenNotReadable(t *testing.T) { eachRuntime(t, testAgentTokenNotReadable) }

// tokenHunt counts the occurrences of the token (read from /tmp/needle,
// so that no argv shows it) in what sandbox root can read of the agent:
// its /proc files and, if it can open it, its memory.
const tokenHunt = `python3 - <<'EOF'
tok = open('/tmp/needle', 'rb').read()
found = 0
for f in ('/proc/1/cmdline', '/proc/1/environ', '/proc/1/maps'):
    try:
        found += open(f, 'rb').read().count(tok)
    except OSError:
        pass
try:
    mem = open('/proc/1/mem', 'rb')
    for line in open('/proc/1/maps'):
        addr, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in addr.split('-'))
        if 'r' in perms:
            try:
                mem.seek(lo)
                found += mem.read(hi - lo).count(tok)
            except OSError:
                pass
except OSError:
    pass
print(found)
EOF`

func testAgentTokenNotReadable(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt})
	tok, ok := env.srv.Manager.AccessToken(id)
	if !ok || tok == "" {
		t.Fatal("no access token")
	}
	// (python, not ls: the stat calls of ls fail under this gVisor.)
	if out := mustSh(t, id, `python3 -c "import os; print(sorted(os.listdir('/run/corral')))"`, asRoot); out != "['agent.sock']\n" {
		t.Fatalf("/run/corral holds %q; want only agent.sock", out)
	}
	for _, cmd := range []string{
		"cat /run/corral/token",
		`python3 -c "open('/proc/1/mem', 'rb')"`,
	} {
		if res := sh(t, id, cmd, asRoot); res.ExitCode == 0 {
			t.Errorf("sandbox root ran %q: exit 0", cmd)
		}
	}
	mustSh(t, id, "cat > /tmp/needle", map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte(tok))})
	if out := mustSh(t, id, tokenHunt, asRoot); out != "0\n" {
		t.Fatalf("sandbox root found the token %q times in the agent's /proc files or memory", out)
	}
	if out := mustSh(t, id, "echo alive"); out != "alive\n" {
		t.Fatalf("agent after the hunt: %q", out)
	}
}

// fakeAgent is a server sandbox root plants on the agent's socket. It
// answers process.Process/List with a gzip bomb (4 GiB inflated),
// SendSignal with a 1 GiB message and Start (exec) with a stream
// envelope that claims 4 GiB; it writes /tmp/fake.ready once it listens.
const fakeAgent = `
import http.server, os, socket, socketserver, zlib
SOCK = '/run/corral/agent.sock'
c = zlib.compressobj(9, zlib.DEFLATED, 31)
zero = bytes(1 << 20)
member = b''.join(c.compress(zero) for _ in range(64)) + c.flush()
BOMB = member * 64
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.0'
    def log_message(self, *a):
        pass
    def zeros(self, n):
        try:
            while n > 0:
                self.wfile.write(zero)
                n -= len(zero)
        except OSError:
            pass
    def do_POST(self):
        n = int(self.headers.get('Content-Length') or 0)
        if n:
            self.rfile.read(n)
        if self.path.endswith('/List'):
            self.send_response(200)
            self.send_header('Content-Type', 'application/proto')
            self.send_header('Content-Encoding', 'gzip')
            self.end_headers()
            try:
                self.wfile.write(BOMB)
            except OSError:
                pass
        elif self.path.endswith('/SendSignal'):
            self.send_response(200)
            self.send_header('Content-Type', 'application/proto')
            self.end_headers()
            self.zeros(1 << 30)
        elif self.path.endswith('/Start'):
            self.send_response(200)
            self.send_header('Content-Type', 'application/connect+proto')
            self.end_headers()
            try:
                self.wfile.write(b'\x00\xff\xff\xff\xff')
            except OSError:
                return
            self.zeros(4 << 30)
        else:
            self.send_response(404)
            self.end_headers()
class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
os.unlink(SOCK)
srv = S(SOCK, H)
open('/tmp/fake.ready', 'w').close()
srv.serve_forever()
`

// TestFakeAgentBomb: sandbox root replaces the agent's socket with its own
// server, which answers the control plane with a compressed multi-GiB
// message, a 1 GiB message and a stream envelope claiming 4 GiB. Each
// call through the control plane (a process list and a signal through
// the agent relay, an exec) fails with a clear error naming the refusal,
// and the control plane (this process) allocates a small fraction of
// what the fake agent sent.
func TestFakeAgentBomb(t *testing.T) { eachRuntime(t, testFakeAgentBomb) }

func testFakeAgentBomb(t *testing.T, rt string) {
	id := create(t, map[string]any{"runtime": rt, "resources": map[string]any{"memory_mb": 512}})
	mustSh(t, id, "cat > /tmp/fake.py <<'EOF'"+fakeAgent+"EOF\n")
	mustSh(t, id, `setsid python3 /tmp/fake.py </dev/null >/tmp/fake.log 2>&1 &
for i in $(seq 600); do test -e /tmp/fake.ready && exit 0; sleep 0.1; done
cat /tmp/fake.log; exit 1`, asRoot)
	// The control plane's idle connections still reach the real agent;
	// dropped (as after their idle timeout), the next calls dial the fake.
	env.srv.Manager.AgentHTTP(id).CloseIdleConnections()

	type reply struct {
		status int
		Code   string `json:"code"`
		Msg    string `json:"message"`
	}
	post := func(path, body string) reply {
		req, _ := http.NewRequest("POST", env.url+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", env.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		r := reply{status: resp.StatusCode}
		_ = json.Unmarshal(data, &r)
		return r
	}
	relay := "/v1/sandboxes/" + id + "/agent/process.Process/"
	var list, signal, exec reply
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	list = post(relay+"List", `{}`)
	signal = post(relay+"SendSignal", `{"process": {"pid": 1}, "signal": "SIGNAL_SIGTERM"}`)
	exec = post("/v1/sandboxes/"+id+"/exec", `{"command": "true"}`)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc

	for _, c := range []struct {
		what string
		got  reply
		want string
	}{
		{"relayed List (gzip bomb)", list, "a gzip reply"},
		{"relayed SendSignal (1 GiB message)", signal, "a message over 16777216 bytes"},
		{"exec (envelope claiming 4 GiB)", exec, "a message of 4294967295 bytes"},
	} {
		if c.got.status/100 == 2 || !strings.Contains(c.got.Msg, "refuses") || !strings.Contains(c.got.Msg, c.want) {
			t.Errorf("%s: status %d %+v; want a refusal naming %q", c.what, c.got.status, c.got, c.want)
		}
	}
	if exec.status != http.StatusBadGateway || exec.Code != "agent_reply_refused" {
		t.Errorf("exec answered by the fake agent: %d %q; want 502 agent_reply_refused", exec.status, exec.Code)
	}
	t.Logf("list %+v; signal %+v; exec %+v; control plane allocated %d MiB", list, signal, exec, alloc>>20)
	if alloc > 512<<20 {
		t.Fatalf("the control plane allocated %d MiB answering three calls to a fake agent", alloc>>20)
	}
}
