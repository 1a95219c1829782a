package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/corralhq/corral/internal/store"
)

func ev(kind, data string) *store.Event {
	return &store.Event{Kind: kind, Data: json.RawMessage(data)}
}

func TestEventCounts(t *testing.T) {
	m := New(Config{})
	for _, e := range []*store.Event{
		ev("egress.http", `{"verdict":"allowed","host":"a.example"}`),
		ev("egress.http", `{"verdict":"refused","reason":"not in the allowlist"}`),
		ev("egress.http", `{"verdict":"refused"}`),
		ev("egress.dns", `{"verdict":"refused"}`),
		ev("sandbox.ended", `{"reason":"killed"}`),
		ev("task.breaker_open", `{"code":"loop_detected"}`),
		ev("file.write", `{"path":"/x","reason":"ignored: not an outcome kind"}`),
		ev("egress.tcp", `not json`),
	} {
		m.Event(e)
	}
	tests := []struct {
		kind, outcome string
		want          float64
	}{
		{"egress.http", "allowed", 1},
		{"egress.http", "refused", 2},
		{"egress.dns", "refused", 1},
		{"sandbox.ended", "killed", 1},
		{"task.breaker_open", "loop_detected", 1},
		{"file.write", "", 1},
		{"egress.tcp", "", 1},
	}
	for _, tc := range tests {
		if got := testutil.ToFloat64(m.events.WithLabelValues(tc.kind, tc.outcome)); got != tc.want {
			t.Errorf("events{%s,%s} = %v, want %v", tc.kind, tc.outcome, got, tc.want)
		}
	}
}

func TestCreateHistogram(t *testing.T) {
	m := New(Config{})
	m.Event(ev("sandbox.created", `{"source":"pool","create_ms":20}`))
	m.Event(ev("sandbox.created", `{"source":"pool","create_ms":30}`))
	m.Event(ev("sandbox.created", `{"source":"template","create_ms":118}`))
	m.Event(ev("sandbox.created", `{"source":"template"}`)) // counted, no time
	want := `
# HELP corral_sandbox_create_seconds Time from admission to a started sandbox, by source (template, snapshot, pool).
# TYPE corral_sandbox_create_seconds histogram
corral_sandbox_create_seconds_bucket{source="pool",le="0.005"} 0
corral_sandbox_create_seconds_bucket{source="pool",le="0.01"} 0
corral_sandbox_create_seconds_bucket{source="pool",le="0.025"} 1
corral_sandbox_create_seconds_bucket{source="pool",le="0.05"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="0.1"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="0.15"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="0.25"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="0.5"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="1"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="2.5"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="5"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="10"} 2
corral_sandbox_create_seconds_bucket{source="pool",le="+Inf"} 2
corral_sandbox_create_seconds_sum{source="pool"} 0.05
corral_sandbox_create_seconds_count{source="pool"} 2
corral_sandbox_create_seconds_bucket{source="template",le="0.005"} 0
corral_sandbox_create_seconds_bucket{source="template",le="0.01"} 0
corral_sandbox_create_seconds_bucket{source="template",le="0.025"} 0
corral_sandbox_create_seconds_bucket{source="template",le="0.05"} 0
corral_sandbox_create_seconds_bucket{source="template",le="0.1"} 0
corral_sandbox_create_seconds_bucket{source="template",le="0.15"} 1
corral_sandbox_create_seconds_bucket{source="template",le="0.25"} 1
corral_sandbox_create_seconds_bucket{source="template",le="0.5"} 1
corral_sandbox_create_seconds_bucket{source="template",le="1"} 1
corral_sandbox_create_seconds_bucket{source="template",le="2.5"} 1
corral_sandbox_create_seconds_bucket{source="template",le="5"} 1
corral_sandbox_create_seconds_bucket{source="template",le="10"} 1
corral_sandbox_create_seconds_bucket{source="template",le="+Inf"} 1
corral_sandbox_create_seconds_sum{source="template"} 0.118
corral_sandbox_create_seconds_count{source="template"} 1
`
	if err := testutil.CollectAndCompare(m.create, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.events.WithLabelValues("sandbox.created", "template")); got != 2 {
		t.Fatalf("sandbox.created{template} = %v, want 2", got)
	}
}

// TestSeriesBounded: past MaxSeries (kind, outcome) pairs, new outcomes
// are counted as "other"; known pairs keep counting.
func TestSeriesBounded(t *testing.T) {
	m := New(Config{})
	for i := 0; i < MaxSeries+50; i++ {
		m.Event(ev("sandbox.ended", fmt.Sprintf(`{"reason":"r%d"}`, i)))
	}
	m.Event(ev("sandbox.ended", `{"reason":"r0"}`))
	if got := testutil.ToFloat64(m.events.WithLabelValues("sandbox.ended", "other")); got != 50 {
		t.Fatalf("other = %v, want 50", got)
	}
	if got := testutil.ToFloat64(m.events.WithLabelValues("sandbox.ended", "r0")); got != 2 {
		t.Fatalf("r0 = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(m.events); n != MaxSeries+1 {
		t.Fatalf("%d series, want %d", n, MaxSeries+1)
	}
}

func TestGaugesAndHandler(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
		not  []string
	}{
		{"all", Config{
			Sandboxes: func(context.Context) (map[string]int, error) { return map[string]int{"running": 3, "paused": 1}, nil },
			Pools: func() []Pool {
				// Two teams pool one template: a pool is (team, template),
				// and two series with the same labels would fail the scrape.
				return []Pool{{Team: "default", Template: "base", Idle: 2, Target: 3, Hits: 7, Misses: 1, Refills: 9, RefillSecondsAvg: 0.115},
					{Team: "team-b", Template: "base", Idle: 1, Target: 1}}
			},
			Admission: func() (int, int) { return 4, 2 },
			Teams:     func() map[string]int { return map[string]int{"default": 1, "team-a": 3} },
			Volumes:   func(context.Context) (int, int64, int64, error) { return 2, 1 << 20, 32 << 20, nil },
		}, []string{
			`corral_volumes 2`, `corral_volume_used_bytes 1.048576e+06`, `corral_volume_size_bytes 3.3554432e+07`,
			`corral_sandboxes{state="running"} 3`, `corral_sandboxes{state="paused"} 1`,
			`corral_pool_idle{team="default",template="base"} 2`, `corral_pool_target{team="default",template="base"} 3`,
			`corral_pool_hits_total{team="default",template="base"} 7`, `corral_pool_misses_total{team="default",template="base"} 1`,
			`corral_pool_refills_total{team="default",template="base"} 9`, `corral_pool_refill_seconds_avg{team="default",template="base"} 0.115`,
			`corral_pool_idle{team="team-b",template="base"} 1`,
			`corral_admission_running 4`, `corral_admission_waiting 2`, `go_goroutines `, `process_open_fds `,
			`corral_team_sandboxes{team="default"} 1`, `corral_team_sandboxes{team="team-a"} 3`,
			`corral_scrape_error{gauge="sandboxes"} 0`, `corral_scrape_error{gauge="volumes"} 0`,
		}, []string{"corral_scrape_error{gauge=\"sandboxes\"} 1", "corral_scrape_error{gauge=\"volumes\"} 1", "corral_scrape_error{gauge=\"usage\"}"}},
		{"store error", Config{
			Sandboxes: func(context.Context) (map[string]int, error) { return nil, errors.New("disk on fire") },
			Volumes:   func(context.Context) (int, int64, int64, error) { return 0, 0, 0, errors.New("no store") },
		}, []string{`corral_scrape_error{gauge="sandboxes"} 1`, `corral_scrape_error{gauge="volumes"} 1`, `corral_sandboxes{state="running"} 0`}, []string{"corral_pool_idle", "corral_admission_running", "corral_volumes ", "corral_team_sandboxes"}},
		{"usage by team", Config{
			Usage: func(context.Context) (map[string]TeamUsage, error) {
				return map[string]TeamUsage{"red": {CPUSeconds: 2.5, MemoryGiBSeconds: 0.75, SandboxSeconds: 60, EgressBytes: 1234, Commands: 7}, "blue": {Commands: 1}}, nil
			},
		}, []string{`corral_usage_cpu_seconds_total{team="red"} 2.5`, `corral_usage_memory_gib_seconds_total{team="red"} 0.75`,
			`corral_usage_sandbox_seconds_total{team="red"} 60`, `corral_usage_egress_bytes_total{team="red"} 1234`,
			`corral_usage_commands_total{team="red"} 7`, `corral_usage_commands_total{team="blue"} 1`, "# TYPE corral_usage_cpu_seconds_total counter",
			`corral_scrape_error{gauge="usage"} 0`}, []string{"corral_scrape_error{gauge=\"usage\"} 1", "corral_scrape_error{gauge=\"sandboxes\"}"}},
		{"usage error", Config{
			Usage: func(context.Context) (map[string]TeamUsage, error) { return nil, errors.New("store closed") },
		}, []string{`corral_scrape_error{gauge="usage"} 1`}, []string{"corral_usage_cpu_seconds_total{"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			New(tc.cfg).Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, body)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(body), w) {
					t.Errorf("missing %q", w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(string(body), n) {
					t.Errorf("unexpected %q", n)
				}
			}
		})
	}
}

// TestSummarisedRefusalsCounted checks that refusals an egress.summary
// event only counted reach the metrics: without it a refusal-rate alert
// undercounts exactly during a flood (the summariser records the first
// refusals of a window one by one and only counts the rest).
func TestSummarisedRefusalsCounted(t *testing.T) {
	m := New(Config{})
	for _, e := range []*store.Event{
		ev("egress.summary", `{"recorded":60,"suppressed":99940,"by_mode":{"dns":99900,"explicit":40}}`),
		ev("egress.summary", `{"recorded":60,"suppressed":5,"by_mode":{"dns":3,"bogus-mode":2,"raw":-1}}`),
		ev("egress.summary", `not json`),
	} {
		m.Event(e)
	}
	tests := []struct {
		mode string
		want float64
	}{
		{"dns", 99903},
		{"explicit", 40},
		{"other", 2},
		{"raw", 0},
		{"transparent", 0},
	}
	for _, tc := range tests {
		if got := testutil.ToFloat64(m.summarised.WithLabelValues(tc.mode)); got != tc.want {
			t.Errorf("summarised{%s} = %v, want %v", tc.mode, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(m.events.WithLabelValues("egress.summary", "")); got != 3 {
		t.Errorf("events{egress.summary} = %v, want 3", got)
	}
}

// TestCommandHistogram: a command's and a code run's duration (from
// their audit events) are observed by kind; an event without a duration
// counts as an event only.
func TestCommandHistogram(t *testing.T) {
	m := New(Config{})
	m.Event(ev("command", `{"command":"true","duration_ms":40}`))
	m.Event(ev("command", `{"command":"sleep 2","duration_ms":2000}`))
	m.Event(ev("code.run", `{"code":"1","duration_ms":300}`))
	m.Event(ev("command", `{"command":"x"}`))
	tests := []struct {
		kind  string
		count uint64
		sum   float64
	}{{"command", 2, 2.04}, {"code.run", 1, 0.3}}
	for _, tc := range tests {
		h := m.command.WithLabelValues(tc.kind).(interface{ Write(*dto.Metric) error })
		var d dto.Metric
		if err := h.Write(&d); err != nil {
			t.Fatal(err)
		}
		if got := d.Histogram.GetSampleCount(); got != tc.count || fmt.Sprintf("%.3f", d.Histogram.GetSampleSum()) != fmt.Sprintf("%.3f", tc.sum) {
			t.Errorf("corral_command_seconds{kind=%q}: count %d sum %v, want %d %v", tc.kind, got, d.Histogram.GetSampleSum(), tc.count, tc.sum)
		}
	}
	if got := testutil.ToFloat64(m.events.WithLabelValues("command", "")); got != 3 {
		t.Errorf("command events = %v, want 3", got)
	}
}

// TestAuditGauges: the audit log's queue and write failures are exported
// as read at scrape.
func TestAuditGauges(t *testing.T) {
	m := New(Config{Audit: func() (int, int64) { return 17, 2 }})
	want := `
# HELP corral_audit_queue_events Audit events recorded and waiting to be written to the store.
# TYPE corral_audit_queue_events gauge
corral_audit_queue_events 17
# HELP corral_audit_write_failures_total Batches of audit events the store refused after every retry (their events are lost).
# TYPE corral_audit_write_failures_total counter
corral_audit_write_failures_total 2
`
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(want), "corral_audit_queue_events", "corral_audit_write_failures_total"); err != nil {
		t.Fatal(err)
	}
}

// TestCreatePhaseHistogram: the phases of a cold create are observed per
// phase; a pool hit's are not, and a phase name outside the fixed set
// (an event is data) never becomes a label value.
func TestCreatePhaseHistogram(t *testing.T) {
	m := New(Config{})
	m.Event(ev("sandbox.created", `{"source":"template","create_ms":80,"phases_ms":{"mounts":2,"agent":30,"bogus":1}}`))
	m.Event(ev("sandbox.created", `{"source":"snapshot","create_ms":90,"phases_ms":{"agent":40}}`))
	m.Event(ev("sandbox.created", `{"source":"pool","create_ms":5,"phases_ms":{"agent":7}}`))
	if n := testutil.CollectAndCount(m.phases); n != 2 {
		t.Fatalf("phase series = %d, want 2 (mounts, agent)", n)
	}
	want := `
# HELP corral_create_phase_seconds Time of each phase of a cold sandbox create (from a template or a snapshot), by phase (docs/performance.md).
# TYPE corral_create_phase_seconds histogram
corral_create_phase_seconds_bucket{phase="agent",le="0.0005"} 0
corral_create_phase_seconds_bucket{phase="agent",le="0.001"} 0
corral_create_phase_seconds_bucket{phase="agent",le="0.0025"} 0
corral_create_phase_seconds_bucket{phase="agent",le="0.005"} 0
corral_create_phase_seconds_bucket{phase="agent",le="0.01"} 0
corral_create_phase_seconds_bucket{phase="agent",le="0.025"} 0
corral_create_phase_seconds_bucket{phase="agent",le="0.05"} 2
corral_create_phase_seconds_bucket{phase="agent",le="0.1"} 2
corral_create_phase_seconds_bucket{phase="agent",le="0.25"} 2
corral_create_phase_seconds_bucket{phase="agent",le="0.5"} 2
corral_create_phase_seconds_bucket{phase="agent",le="1"} 2
corral_create_phase_seconds_bucket{phase="agent",le="5"} 2
corral_create_phase_seconds_bucket{phase="agent",le="+Inf"} 2
corral_create_phase_seconds_sum{phase="agent"} 0.07
corral_create_phase_seconds_count{phase="agent"} 2
corral_create_phase_seconds_bucket{phase="mounts",le="0.0005"} 0
corral_create_phase_seconds_bucket{phase="mounts",le="0.001"} 0
corral_create_phase_seconds_bucket{phase="mounts",le="0.0025"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.005"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.01"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.025"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.05"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.1"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.25"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="0.5"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="1"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="5"} 1
corral_create_phase_seconds_bucket{phase="mounts",le="+Inf"} 1
corral_create_phase_seconds_sum{phase="mounts"} 0.002
corral_create_phase_seconds_count{phase="mounts"} 1
`
	if err := testutil.CollectAndCompare(m.phases, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
