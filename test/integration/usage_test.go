package integration

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/usage"
	"github.com/corralhq/corral/internal/watchdog"
	corral "github.com/corralhq/corral/sdk/go"
)

// sampleLog keeps every watchdog sample of every sandbox, as the server's
// watchdog recorded them (watchdog.Config.OnSample, beside the meter's).
type sampleLog struct {
	mu  sync.Mutex
	all map[string][]watchdog.Sample
}

func (l *sampleLog) add(id string, s watchdog.Sample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all[id] = append(l.all[id], s)
}

// of returns the samples of a sandbox in order, leaving out any that is
// older than one before it (as the meter does: a round that read the
// counters before the final reading at the sandbox's end).
func (l *sampleLog) of(id string) []watchdog.Sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []watchdog.Sample
	for _, s := range l.all[id] {
		if len(out) == 0 || !s.Time.Before(out[len(out)-1].Time) {
			out = append(out, s)
		}
	}
	return out
}

// count is the number of samples received of the sandboxes.
func (l *sampleLog) count(ids ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, id := range ids {
		n += len(l.all[id])
	}
	return n
}

// memoryGiBSeconds integrates samples the way the meter's documentation
// says: the trapezoid over each interval of at most usage.MaxSampleGap
// between consecutive samples whose CPU counter did not go backwards.
func memoryGiBSeconds(ss []watchdog.Sample) float64 {
	var sum float64
	for i := 1; i < len(ss); i++ {
		a, b := ss[i-1], ss[i]
		dt := b.Time.Sub(a.Time)
		if b.CPUSeconds < a.CPUSeconds || dt <= 0 || dt > usage.MaxSampleGap {
			continue
		}
		sum += (float64(a.MemoryBytes) + float64(b.MemoryBytes)) / 2 * dt.Seconds() / (1 << 30)
	}
	return sum
}

func closeTo(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// rowsClose compares two usage rows, the floats within rounding (the
// same amounts summed in another order).
func rowsClose(a, b corral.UsageRow) bool {
	fa, fb := a, b
	fa.CPUSeconds, fa.MemoryGiBSeconds, fa.SandboxSeconds = 0, 0, 0
	fb.CPUSeconds, fb.MemoryGiBSeconds, fb.SandboxSeconds = 0, 0, 0
	return fa == fb && closeTo(a.CPUSeconds, b.CPUSeconds) && closeTo(a.MemoryGiBSeconds, b.MemoryGiBSeconds) && closeTo(a.SandboxSeconds, b.SandboxSeconds)
}

// TestUsage meters known work end to end on a real server: one runc
// sandbox of a task burns at least 2 CPU-seconds (a shell loop that
// stops when its own CPU time reaches 200 clock ticks), fetches a file of
// known size twice through the egress proxy from the test's upstream (in
// a network namespace the test made), and runs N commands in all; a
// second team's member key runs a sandbox of its own. Then usage, read
// through the API, the Go SDK, the CLI and /metrics, must equal what the
// other records say:
//
//   - commands == N exactly (and == the sandbox's command records);
//   - egress bytes == the sum of bytes_up + bytes_down of the sandbox's
//     egress audit events, exactly, and the bytes down cover the two
//     files;
//   - CPU seconds == the watchdog's last sample's cumulative CPU (the
//     same samples, seen by a hook beside the meter's), and at least the
//     2 s burnt;
//   - memory GiB-seconds == the trapezoid of the watchdog's samples, and
//     at most the memory limit times the sandbox's life;
//   - sandbox-seconds == ended_at - created_at of the record;
//   - the task, agent and team rows equal the sandbox's (it is the only
//     one of its task and team), the other team's usage is its own, a
//     member asking for another team is refused (403 forbidden), and the
//     Prometheus counters by team equal the API's totals.
//
// It defends against a meter that drifts from the records chargeback is
// checked against: double counting, lost samples or events, usage booked
// to the wrong team.
func TestUsage(t *testing.T) {
	need(t)
	fx := newNetFixture(t)
	samples := &sampleLog{all: map[string][]watchdog.Sample{}}
	s := startNetServer(t, fx, "usage", func(c *server.Config) { c.Watchdog.OnSample = samples.add })
	ctx := context.Background()
	srv := s.ts.Srv

	betaKey := "e2b_" + hex.EncodeToString(randBytes(t, 20))
	if err := srv.Store.AddAPIKey(ctx, "beta", betaKey, "beta", "member"); err != nil {
		t.Fatal(err)
	}
	beta := corral.New(s.ts.URL, betaKey)

	const size = 3<<20 + 12345
	fx.up.serveFile("/usage/blob", randBytes(t, size))
	task, err := s.c.CreateTask(ctx, corral.TaskOptions{Agent: "usage-agent", NoLoopCheck: true, MaxCalls: 100})
	if err != nil {
		t.Fatal(err)
	}
	sb := fx.newSandbox(t, s, corral.CreateOptions{Network: "allow", Allow: []string{hostAllowed}, Task: task.ID})
	n := 0
	run := func(cmd string) *corral.CommandResult {
		t.Helper()
		n++
		res := runIn(t, sb, cmd)
		if res.ExitCode != 0 {
			t.Fatalf("%q: exit %d, stderr %q", cmd, res.ExitCode, res.Stderr)
		}
		return res
	}
	// utime + stime of the shell itself, in clock ticks (fields 14 and 15).
	run(`while :; do read -r -a st < /proc/$$/stat; (( st[13] + st[14] >= 200 )) && break; done`)
	for i := range 2 {
		res := run(fmt.Sprintf("curl -sS --max-time 60 -o /tmp/blob%d -w '%%{size_download}' http://%s/usage/blob", i, hostAllowed))
		if res.Stdout != fmt.Sprint(size) {
			t.Fatalf("fetch %d: downloaded %q bytes, want %d", i, res.Stdout, size)
		}
	}
	for range 3 {
		run("true")
	}
	if reqs := fx.up.requests("/usage/blob"); len(reqs) != 2 {
		t.Fatalf("upstream saw %d fetches, want 2", len(reqs))
	}
	// The proxy records a fetch once it has finished, which may be just
	// after curl saw the end of the body.
	for deadline := time.Now().Add(30 * time.Second); ; {
		fetches := 0
		for _, e := range egressEvents(t, s, sb.ID, 0) {
			if e.Kind == "egress.http" && e.BytesDown >= size {
				fetches++
			}
		}
		if fetches == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d egress.http events of the fetches, want 2", fetches)
		}
		time.Sleep(100 * time.Millisecond)
	}
	betaSb, err := beta.Create(ctx, corral.CreateOptions{Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("beta create: %v", err)
	}
	for range 2 {
		if _, err := betaSb.Run(ctx, "true", corral.RunOptions{Timeout: time.Minute}); err != nil {
			t.Fatalf("beta run: %v", err)
		}
	}

	if _, err := s.c.Kill(ctx, sb.ID); err != nil {
		t.Fatalf("kill %s: %v", sb.ID, err)
	}
	if _, err := beta.Kill(ctx, betaSb.ID); err != nil {
		t.Fatalf("beta kill %s: %v", betaSb.ID, err)
	}
	// A round that read the counters just before the kill may still be
	// delivering its sample: wait until no sample has come for 3 s.
	for deadline, last := time.Now().Add(time.Minute), -1; ; {
		cur := samples.count(sb.ID, betaSb.ID)
		if cur == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("samples still arrive a minute after the kill")
		}
		last = cur
		time.Sleep(3 * time.Second)
	}

	rep, err := s.c.Usage(ctx, corral.UsageQuery{By: corral.UsageBySandbox})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Team != "default" || len(rep.Rows) != 1 || rep.Rows[0].Sandbox != sb.ID {
		t.Fatalf("default team's report %+v: want the one sandbox %s", rep, sb.ID)
	}
	row := rep.Rows[0]
	t.Logf("sandbox usage: %+v", row.UsageAmounts)

	if cmds, err := srv.Store.ListCommands(ctx, sb.ID); err != nil || row.Commands != int64(n) || len(cmds) != n {
		t.Errorf("commands: metered %d, records %d (%v), want %d", row.Commands, len(cmds), err, n)
	}

	var up, down int64
	for _, e := range egressEvents(t, s, sb.ID, 0) {
		up, down = up+e.BytesUp, down+e.BytesDown
	}
	if row.EgressBytesUp != up || row.EgressBytesDown != down || row.EgressBytes != up+down {
		t.Errorf("egress: metered up %d down %d total %d, audit events up %d down %d", row.EgressBytesUp, row.EgressBytesDown, row.EgressBytes, up, down)
	}
	if down < 2*size || down > 2*size+64<<10 {
		t.Errorf("egress bytes down %d, want the two files (%d) and their headers", down, 2*size)
	}

	ss := samples.of(sb.ID)
	if len(ss) < 2 {
		t.Fatalf("only %d watchdog samples of the sandbox", len(ss))
	}
	last := ss[len(ss)-1]
	if !closeTo(row.CPUSeconds, last.CPUSeconds) {
		t.Errorf("CPU seconds %v, the watchdog's last sample says %v", row.CPUSeconds, last.CPUSeconds)
	}
	if row.CPUSeconds < 2.0 || row.CPUSeconds > 15 {
		t.Errorf("CPU seconds %v for a 2 CPU-second burn, a few commands and two downloads", row.CPUSeconds)
	}
	if mem := memoryGiBSeconds(ss); !closeTo(row.MemoryGiBSeconds, mem) {
		t.Errorf("memory %v GiB·s, the watchdog's samples integrate to %v", row.MemoryGiBSeconds, mem)
	}
	rec, err := srv.Store.GetSandbox(ctx, sb.ID)
	if err != nil || rec.EndedAt == nil {
		t.Fatalf("sandbox record %+v, %v", rec, err)
	}
	life := float64(rec.EndedAt.Sub(rec.CreatedAt).Milliseconds()) / 1000
	if math.Abs(row.SandboxSeconds-life) > 1e-6 || row.Sandboxes != 1 {
		t.Errorf("sandbox seconds %v (%d sandboxes), the record lived %v s", row.SandboxSeconds, row.Sandboxes, life)
	}
	limitGiB := float64(rec.Resources.MemoryMB) / 1024
	if row.MemoryGiBSeconds <= 0 || row.MemoryGiBSeconds > limitGiB*life {
		t.Errorf("memory %v GiB·s outside (0, %v GiB × %v s]", row.MemoryGiBSeconds, limitGiB, life)
	}

	for _, by := range []string{corral.UsageByTask, corral.UsageByAgent, corral.UsageByTeam} {
		r, err := s.c.Usage(ctx, corral.UsageQuery{By: by})
		if err != nil {
			t.Fatal(err)
		}
		want := row
		want.Sandbox = ""
		switch by {
		case corral.UsageByAgent:
			want.Task = ""
		case corral.UsageByTeam:
			want.Task, want.Agent = "", ""
		}
		if len(r.Rows) != 1 || !rowsClose(r.Rows[0], want) || !rowsClose(corral.UsageRow{UsageAmounts: r.Totals}, corral.UsageRow{UsageAmounts: row.UsageAmounts}) {
			t.Errorf("by %s: rows %+v totals %+v, want one row %+v", by, r.Rows, r.Totals, want)
		}
	}
	if row.Task != task.ID || row.Agent != "usage-agent" || row.Team != "default" {
		t.Errorf("row key %s/%s/%s, want default/usage-agent/%s", row.Team, row.Agent, row.Task, task.ID)
	}
	// A window that ended before the sandbox existed holds nothing.
	if r, err := s.c.Usage(ctx, corral.UsageQuery{Since: rec.CreatedAt.Add(-time.Hour), Until: rec.CreatedAt.Add(-30 * time.Minute)}); err != nil ||
		r.Totals != (corral.UsageAmounts{}) {
		t.Errorf("usage of an earlier window: %+v, %v", r, err)
	}

	br, err := beta.Usage(ctx, corral.UsageQuery{By: corral.UsageBySandbox})
	if err != nil {
		t.Fatal(err)
	}
	if br.Team != "beta" || len(br.Rows) != 1 || br.Rows[0].Sandbox != betaSb.ID || br.Totals.Commands != 2 || br.Totals.EgressBytes != 0 {
		t.Errorf("beta's report %+v: want its one sandbox and its 2 commands", br)
	}
	var ae *corral.APIError
	if _, err := beta.Usage(ctx, corral.UsageQuery{Team: "default"}); !errors.As(err, &ae) || ae.Code != corral.CodeForbidden {
		t.Errorf("beta member asking for team default: %v, want forbidden", err)
	}
	all, err := s.c.Usage(ctx, corral.UsageQuery{Team: "all", By: corral.UsageByTeam})
	if err != nil || len(all.Rows) != 2 || all.Totals.Commands != int64(n)+2 {
		t.Errorf("admin ?team=all: %+v, %v", all, err)
	}

	fams := scrapeAt(t, s.ts.URL, s.ts.Key)
	for _, tc := range []struct {
		team string
		a    corral.UsageAmounts
	}{{"default", row.UsageAmounts}, {"beta", br.Totals}} {
		got := map[string]float64{
			"cpu_seconds": value(fams, "corral_usage_cpu_seconds_total", "team", tc.team), "memory_gib_seconds": value(fams, "corral_usage_memory_gib_seconds_total", "team", tc.team),
			"sandbox_seconds": value(fams, "corral_usage_sandbox_seconds_total", "team", tc.team), "egress_bytes": value(fams, "corral_usage_egress_bytes_total", "team", tc.team),
			"commands": value(fams, "corral_usage_commands_total", "team", tc.team),
		}
		want := map[string]float64{"cpu_seconds": tc.a.CPUSeconds, "memory_gib_seconds": tc.a.MemoryGiBSeconds, "sandbox_seconds": tc.a.SandboxSeconds,
			"egress_bytes": float64(tc.a.EgressBytes), "commands": float64(tc.a.Commands)}
		for k := range want {
			if math.Abs(got[k]-want[k]) > 1e-6*math.Max(1, want[k]) {
				t.Errorf("corral_usage_%s_total{team=%q} = %v, the API says %v", k, tc.team, got[k], want[k])
			}
		}
	}

	out, err := exec.Command(s.ts.Bin, "usage", "--server", s.ts.URL, "--api-key", s.ts.Key, "--by", "sandbox", "--since", "1h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), sb.ID) || !strings.Contains(string(out), task.ID) {
		t.Errorf("corral usage --by sandbox: %v\n%s", err, out)
	}
	out, err = exec.Command(s.ts.Bin, "usage", "--server", s.ts.URL, "--api-key", s.ts.Key, "--json").Output()
	var cli corral.UsageReport
	if err != nil || json.Unmarshal(out, &cli) != nil || cli.Totals.Commands != int64(n) {
		t.Errorf("corral usage --json: %v\n%s", err, out)
	}
	out, err = exec.Command(s.ts.Bin, "usage", "--server", s.ts.URL, "--api-key", betaKey, "--team", "default").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "admin") {
		t.Errorf("corral usage --team default with beta's member key: %v\n%s", err, out)
	}
}

// scrapeAt reads GET /metrics of the server at url with key.
func scrapeAt(t *testing.T, url, key string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}
