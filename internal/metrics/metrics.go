// Package metrics exposes corral's operational metrics in the Prometheus
// text format (docs/configuration.md, "Metrics"): counters of audit events
// by kind and outcome, the time sandboxes take to start and commands take
// to run, gauges read when scraped (sandboxes by state, warm pools,
// admission, the audit log's queue and write failures) and the usage
// meter's counters by team, read when scraped, beside the Go
// runtime's and the process's own metrics.
//
// Events reach it through [Metrics.Event], which the audit log calls for
// every event it records, so every counted event is also in the audit log.
package metrics

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// MaxSeries bounds the (kind, outcome) pairs counted; past it, new pairs
// are counted with outcome "other", so a bug cannot grow memory without
// bound.
const MaxSeries = 1000

// outcomeField names, for the kinds that have one, the field of an
// event's data that becomes its "outcome" label. Every value of these
// fields comes from a fixed set in the code.
var outcomeField = map[string]string{
	"egress.http":       "verdict",
	"egress.connect":    "verdict",
	"egress.tcp":        "verdict",
	"egress.dns":        "verdict",
	"sandbox.created":   "source",
	"sandbox.ended":     "reason",
	"task.breaker_open": "code",
	"task.call_refused": "code",
	"reaper.reclaimed":  "reason",
}

// Pool is the state of one warm pool at scrape time.
type Pool struct {
	// Team and Template name the pool: two teams may each pool one
	// template.
	Team             string
	Template         string
	Idle, Target     int
	Hits, Misses     int64
	Refills          int64
	RefillSecondsAvg float64
}

// Config says where the gauges are read when a scrape comes in. Nil
// functions leave their metrics out.
type Config struct {
	// Sandboxes counts recorded sandboxes by state (running, paused).
	Sandboxes func(ctx context.Context) (map[string]int, error)
	// Pools lists the warm pools.
	Pools func() []Pool
	// Admission returns the sandboxes admitted and the creates waiting.
	Admission func() (running, waiting int)
	// Teams returns the sandboxes admitted per team (teams with none
	// may be absent). Team names are admin-made (API keys), so the
	// label's values are bounded.
	Teams func() map[string]int
	// Volumes returns the number of volumes, the bytes they use and
	// their total size.
	Volumes func(ctx context.Context) (count int, usedBytes, sizeBytes int64, err error)
	// Usage returns every team's metered usage so far (the usage meter's
	// totals), exported as the corral_usage_*_total counters.
	Usage func(ctx context.Context) (map[string]TeamUsage, error)
	// Audit returns the audit log's queued events and the batches the
	// store refused (audit.Log.Stats).
	Audit func() (queued int, writeFailures int64)
}

// TeamUsage is one team's metered usage so far.
type TeamUsage struct {
	CPUSeconds, MemoryGiBSeconds, SandboxSeconds float64
	EgressBytes, Commands                        int64
}

// Metrics is corral's metric registry. It is safe for concurrent use.
type Metrics struct {
	reg    *prometheus.Registry
	events *prometheus.CounterVec
	create *prometheus.HistogramVec
	// command is the duration of commands and code runs, from their
	// audit events.
	command *prometheus.HistogramVec
	// phases is the time of each phase of a cold create (from a template
	// or a snapshot, not from a warm pool), by phase.
	phases *prometheus.HistogramVec
	// summarised counts the egress refusals that were only counted in an
	// egress.summary event, by mode, so that a refusal-rate alert sees a
	// flood whose events were summarised.
	summarised *prometheus.CounterVec

	mu     sync.Mutex
	series map[[2]string]bool // (kind, outcome) pairs seen; guarded by mu
}

// New returns a registry with corral's metrics and the Go and process
// collectors.
func New(cfg Config) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_events_total",
			Help: "Audit events recorded, by kind and outcome (egress verdict, end reason, breaker code, create source; empty for other kinds).",
		}, []string{"kind", "outcome"}),
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_sandbox_create_seconds",
			Help:    "Time from admission to a started sandbox, by source (template, snapshot, pool).",
			Buckets: []float64{.005, .01, .025, .05, .1, .15, .25, .5, 1, 2.5, 5, 10},
		}, []string{"source"}),
		command: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_command_seconds",
			Help:    "Time from start to end of a command (kind command: exec, the agent API's process.Start, the CLI) or a code run (kind code.run), from its audit event.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"kind"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_create_phase_seconds",
			Help:    "Time of each phase of a cold sandbox create (from a template or a snapshot), by phase (docs/performance.md).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"phase"}),
		summarised: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_egress_refusals_summarised_total",
			Help: "Egress refusals counted in egress.summary events instead of recorded one by one, by mode (explicit, transparent, raw, dns).",
		}, []string{"mode"}),
		series: map[[2]string]bool{},
	}
	m.reg.MustRegister(m.events, m.create, m.command, m.phases, m.summarised, &gauges{cfg: cfg},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Event counts one audit event (and, for sandbox.created, its start
// time). The audit log calls it for every event it records.
func (m *Metrics) Event(ev *store.Event) {
	outcome := ""
	var data struct {
		Verdict  string             `json:"verdict"`
		Source   string             `json:"source"`
		Reason   string             `json:"reason"`
		Code     string             `json:"code"`
		CreateMS *float64           `json:"create_ms"`
		PhasesMS map[string]float64 `json:"phases_ms"`
	}
	if field, ok := outcomeField[ev.Kind]; ok && json.Unmarshal(ev.Data, &data) == nil {
		switch field {
		case "verdict":
			outcome = data.Verdict
		case "source":
			outcome = data.Source
		case "reason":
			outcome = data.Reason
		case "code":
			outcome = data.Code
		}
		if ev.Kind == "sandbox.created" && data.CreateMS != nil && outcome != "" {
			m.create.WithLabelValues(outcome).Observe(*data.CreateMS / 1000)
		}
		if ev.Kind == "sandbox.created" && outcome != "pool" {
			m.observePhases(data.PhasesMS)
		}
	}
	if ev.Kind == "command" || ev.Kind == "code.run" {
		var d struct {
			DurationMS *float64 `json:"duration_ms"`
		}
		if json.Unmarshal(ev.Data, &d) == nil && d.DurationMS != nil && *d.DurationMS >= 0 {
			m.command.WithLabelValues(ev.Kind).Observe(*d.DurationMS / 1000)
		}
	}
	m.events.WithLabelValues(m.bound(ev.Kind, outcome)).Inc()
	if ev.Kind == "egress.summary" {
		m.countSummarised(ev)
	}
}

// observePhases records the phases of one cold create. Only the phases
// runtime.PhaseNames lists are counted, so the label's values are a fixed
// set whatever an event holds.
func (m *Metrics) observePhases(ms map[string]float64) {
	for _, name := range runtime.PhaseNames {
		if v, ok := ms[name]; ok && v >= 0 {
			m.phases.WithLabelValues(name).Observe(v / 1000)
		}
	}
}

// summaryModes are the modes an egress.summary event counts refusals by
// (egress.Event.Mode); any other key is counted as "other".
var summaryModes = map[string]bool{egress.EventExplicit: true, egress.EventTransparent: true, egress.EventRaw: true, egress.EventDNS: true}

// countSummarised adds the refusals an egress.summary event only counted.
func (m *Metrics) countSummarised(ev *store.Event) {
	var data struct {
		ByMode map[string]int `json:"by_mode"`
	}
	if json.Unmarshal(ev.Data, &data) != nil {
		return
	}
	for mode, n := range data.ByMode {
		if n <= 0 {
			continue
		}
		if !summaryModes[mode] {
			mode = "other"
		}
		m.summarised.WithLabelValues(mode).Add(float64(n))
	}
}

// bound returns the label values to count (kind, outcome) under: as given
// while fewer than MaxSeries pairs were seen, else with outcome "other".
func (m *Metrics) bound(kind, outcome string) (string, string) {
	if len(outcome) > 64 {
		outcome = outcome[:64]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := [2]string{kind, outcome}
	if !m.series[key] {
		if len(m.series) >= MaxSeries {
			return kind, "other"
		}
		m.series[key] = true
	}
	return kind, outcome
}

// gauges reads the state gauges when scraped.
type gauges struct{ cfg Config }

var (
	sandboxesDesc = prometheus.NewDesc("corral_sandboxes", "Recorded sandboxes by state.", []string{"state"}, nil)
	poolIdleDesc  = prometheus.NewDesc("corral_pool_idle", "Idle sandboxes in a warm pool.", []string{"team", "template"}, nil)
	poolTgtDesc   = prometheus.NewDesc("corral_pool_target", "The size a warm pool refills to.", []string{"team", "template"}, nil)
	poolHitsDesc  = prometheus.NewDesc("corral_pool_hits_total", "Creates served from a warm pool.", []string{"team", "template"}, nil)
	poolMissDesc  = prometheus.NewDesc("corral_pool_misses_total", "Creates for a pooled template that found the pool empty.", []string{"team", "template"}, nil)
	poolRefDesc   = prometheus.NewDesc("corral_pool_refills_total", "Sandboxes started to refill a warm pool.", []string{"team", "template"}, nil)
	poolRefAvg    = prometheus.NewDesc("corral_pool_refill_seconds_avg", "Average time to start one pooled sandbox.", []string{"team", "template"}, nil)
	admRunDesc    = prometheus.NewDesc("corral_admission_running", "Sandboxes admitted (running, paused or starting).", nil, nil)
	admWaitDesc   = prometheus.NewDesc("corral_admission_waiting", "Creates waiting in the admission queue.", nil, nil)
	teamRunDesc   = prometheus.NewDesc("corral_team_sandboxes", "Sandboxes admitted per team (running, paused or starting).", []string{"team"}, nil)
	volCountDesc  = prometheus.NewDesc("corral_volumes", "Volumes on this server.", nil, nil)
	volUsedDesc   = prometheus.NewDesc("corral_volume_used_bytes", "Bytes used on all volumes together.", nil, nil)
	volSizeDesc   = prometheus.NewDesc("corral_volume_size_bytes", "Size of all volumes together (their caps).", nil, nil)
	usageCPUDesc  = prometheus.NewDesc("corral_usage_cpu_seconds_total", "CPU seconds used by the team's sandboxes (the usage meter).", []string{"team"}, nil)
	usageMemDesc  = prometheus.NewDesc("corral_usage_memory_gib_seconds_total", "Memory GiB-seconds used by the team's sandboxes (the usage meter).", []string{"team"}, nil)
	usageSbDesc   = prometheus.NewDesc("corral_usage_sandbox_seconds_total", "Seconds the team's sandboxes existed, created to ended (the usage meter).", []string{"team"}, nil)
	usageEgDesc   = prometheus.NewDesc("corral_usage_egress_bytes_total", "Bytes the egress proxy carried for the team's sandboxes, both ways (the usage meter).", []string{"team"}, nil)
	usageCmdDesc  = prometheus.NewDesc("corral_usage_commands_total", "Commands started in the team's sandboxes (the usage meter).", []string{"team"}, nil)
	auditQDesc    = prometheus.NewDesc("corral_audit_queue_events", "Audit events recorded and waiting to be written to the store.", nil, nil)
	auditFailDesc = prometheus.NewDesc("corral_audit_write_failures_total", "Batches of audit events the store refused after every retry (their events are lost).", nil, nil)
	scrapeErrDesc = prometheus.NewDesc("corral_scrape_error", "1 when a gauge (sandboxes, volumes, usage: read from the store) could not be read in this scrape, else 0.", []string{"gauge"}, nil)
)

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, poolIdleDesc, poolTgtDesc, poolHitsDesc, poolMissDesc, poolRefDesc, poolRefAvg, admRunDesc, admWaitDesc, teamRunDesc, volCountDesc, volUsedDesc, volSizeDesc,
		usageCPUDesc, usageMemDesc, usageSbDesc, usageEgDesc, usageCmdDesc, auditQDesc, auditFailDesc, scrapeErrDesc} {
		ch <- d
	}
}

// scrapeError is corral_scrape_error of one gauge source: 1 when err
// is set, else 0 (present either way, so that an alert on it needs no
// absent()).
func scrapeError(gauge string, err error) prometheus.Metric {
	v := 0.0
	if err != nil {
		v = 1
	}
	return prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, v, gauge)
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	if f := g.cfg.Sandboxes; f != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		counts, err := f(ctx)
		cancel()
		ch <- scrapeError("sandboxes", err)
		for _, state := range []string{"running", "paused"} { // always present, 0 included
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(counts[state]), state)
		}
	}
	if f := g.cfg.Pools; f != nil {
		for _, p := range f() {
			ch <- prometheus.MustNewConstMetric(poolIdleDesc, prometheus.GaugeValue, float64(p.Idle), p.Team, p.Template)
			ch <- prometheus.MustNewConstMetric(poolTgtDesc, prometheus.GaugeValue, float64(p.Target), p.Team, p.Template)
			ch <- prometheus.MustNewConstMetric(poolHitsDesc, prometheus.CounterValue, float64(p.Hits), p.Team, p.Template)
			ch <- prometheus.MustNewConstMetric(poolMissDesc, prometheus.CounterValue, float64(p.Misses), p.Team, p.Template)
			ch <- prometheus.MustNewConstMetric(poolRefDesc, prometheus.CounterValue, float64(p.Refills), p.Team, p.Template)
			ch <- prometheus.MustNewConstMetric(poolRefAvg, prometheus.GaugeValue, p.RefillSecondsAvg, p.Team, p.Template)
		}
	}
	if f := g.cfg.Volumes; f != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, used, size, err := f(ctx)
		cancel()
		ch <- scrapeError("volumes", err)
		if err == nil {
			ch <- prometheus.MustNewConstMetric(volCountDesc, prometheus.GaugeValue, float64(n))
			ch <- prometheus.MustNewConstMetric(volUsedDesc, prometheus.GaugeValue, float64(used))
			ch <- prometheus.MustNewConstMetric(volSizeDesc, prometheus.GaugeValue, float64(size))
		}
	}
	if f := g.cfg.Usage; f != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		teams, err := f(ctx)
		cancel()
		ch <- scrapeError("usage", err)
		for team, u := range teams {
			ch <- prometheus.MustNewConstMetric(usageCPUDesc, prometheus.CounterValue, u.CPUSeconds, team)
			ch <- prometheus.MustNewConstMetric(usageMemDesc, prometheus.CounterValue, u.MemoryGiBSeconds, team)
			ch <- prometheus.MustNewConstMetric(usageSbDesc, prometheus.CounterValue, u.SandboxSeconds, team)
			ch <- prometheus.MustNewConstMetric(usageEgDesc, prometheus.CounterValue, float64(u.EgressBytes), team)
			ch <- prometheus.MustNewConstMetric(usageCmdDesc, prometheus.CounterValue, float64(u.Commands), team)
		}
	}
	if f := g.cfg.Audit; f != nil {
		queued, failures := f()
		ch <- prometheus.MustNewConstMetric(auditQDesc, prometheus.GaugeValue, float64(queued))
		ch <- prometheus.MustNewConstMetric(auditFailDesc, prometheus.CounterValue, float64(failures))
	}
	if f := g.cfg.Admission; f != nil {
		running, waiting := f()
		ch <- prometheus.MustNewConstMetric(admRunDesc, prometheus.GaugeValue, float64(running))
		ch <- prometheus.MustNewConstMetric(admWaitDesc, prometheus.GaugeValue, float64(waiting))
	}
	if f := g.cfg.Teams; f != nil {
		for team, n := range f() {
			ch <- prometheus.MustNewConstMetric(teamRunDesc, prometheus.GaugeValue, float64(n), team)
		}
	}
}
