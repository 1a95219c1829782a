package integration

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	corral "github.com/corralhq/corral/sdk/go"
)

// dashboardFile is the Grafana dashboard of the repository
// (docs/monitoring.md).
const dashboardFile = "../../deploy/grafana/corral.json"

// promqlUse is what one PromQL expression refers to: metric names, the
// labels its selectors match on per metric, and the labels it groups by.
type promqlUse struct {
	Metrics  []string
	Matchers map[string][]string
	Grouping []string
}

var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	promqlMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promqlBraces   = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	labelValues    = regexp.MustCompile(`^\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{[^}]*\})?\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
)

// promqlKeywords are PromQL's words that are not metric names.
var promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}

// parsePromQL finds what expr refers to. It is no PromQL parser: string
// literals, selectors' braces and range brackets are taken out, grouping
// clauses are read, and every remaining name not followed by "(" (a
// function) and not a keyword is a metric. Grafana's label_values(metric,
// label) (a variable's query) is read as that metric and label.
func parsePromQL(expr string) promqlUse {
	u := promqlUse{Matchers: map[string][]string{}}
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		u.Metrics, u.Grouping = []string{m[1]}, []string{m[2]}
		return u
	}
	e := promqlString.ReplaceAllString(expr, `""`)
	for _, m := range promqlSelector.FindAllStringSubmatch(e, -1) {
		for _, l := range promqlMatcher.FindAllStringSubmatch(m[2], -1) {
			u.Matchers[m[1]] = append(u.Matchers[m[1]], l[1])
		}
	}
	e = promqlBraces.ReplaceAllString(e, " ")
	for _, m := range promqlGrouping.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				u.Grouping = append(u.Grouping, l)
			}
		}
	}
	e = promqlGrouping.ReplaceAllString(e, " ")
	for _, m := range promqlIdent.FindAllStringSubmatchIndex(e, -1) {
		name := e[m[0]:m[1]]
		if m[2] >= 0 { // a function call
			continue
		}
		if m[0] > 0 && (e[m[0]-1] >= '0' && e[m[0]-1] <= '9' || e[m[0]-1] == '.') {
			continue // the exponent or unit of a number
		}
		if !promqlKeywords[strings.ToLower(name)] && !slices.Contains(u.Metrics, name) {
			u.Metrics = append(u.Metrics, name)
		}
	}
	return u
}

// TestParsePromQL checks the expression reader the dashboard test relies
// on, so that a metric name it misses cannot let a rotten panel pass.
func TestParsePromQL(t *testing.T) {
	tests := []struct {
		expr     string
		metrics  string
		grouping string
		matchers string
	}{
		{`sum(corral_sandboxes{state="running"})`, "corral_sandboxes", "", "corral_sandboxes:state"},
		{`histogram_quantile(0.95, sum by (le, source) (rate(corral_sandbox_create_seconds_bucket[$__rate_interval])))`,
			"corral_sandbox_create_seconds_bucket", "le,source", ""},
		{`sum by (team) (rate(corral_usage_cpu_seconds_total{team=~"$team"}[5m])) / on (team) group_left sum(x_total{a!="b {c}", d!~"e"})`,
			"corral_usage_cpu_seconds_total,x_total", "team,team", "corral_usage_cpu_seconds_total:team x_total:a,d"},
		{`sum(increase(corral_events_total{kind=~"watchdog\\.(oom|cpu_runaway)"}[1h])) or vector(0)`, "corral_events_total", "", "corral_events_total:kind"},
		{`sum(corral_audit_write_failures_total) + sum(corral_scrape_error) > 1e3`, "corral_audit_write_failures_total,corral_scrape_error", "", ""},
		{`label_values(corral_usage_cpu_seconds_total, team)`, "corral_usage_cpu_seconds_total", "team", ""},
		{`time() - process_start_time_seconds offset 5m`, "process_start_time_seconds", "", ""},
	}
	for _, tc := range tests {
		u := parsePromQL(tc.expr)
		var ms []string
		for m, ls := range u.Matchers {
			ms = append(ms, m+":"+strings.Join(ls, ","))
		}
		sort.Strings(ms)
		if got := strings.Join(u.Metrics, ","); got != tc.metrics {
			t.Errorf("%s: metrics %q, want %q", tc.expr, got, tc.metrics)
		}
		if got := strings.Join(u.Grouping, ","); got != tc.grouping {
			t.Errorf("%s: grouping %q, want %q", tc.expr, got, tc.grouping)
		}
		if got := strings.Join(ms, " "); got != tc.matchers {
			t.Errorf("%s: matchers %q, want %q", tc.expr, got, tc.matchers)
		}
	}
}

// dashboardExprs returns every PromQL expression of the dashboard: its
// panels' targets (rows' nested panels too), its annotations and its
// variables' queries, each with where it is.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			ID      int    `json:"id"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			Panels []json.RawMessage `json:"panels"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Annotations struct {
			List []struct {
				Name string `json:"name"`
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid dashboard JSON: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Fatalf("dashboard without title or uid")
	}
	exprs := map[string]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if len(p.Panels) > 0 {
			t.Fatalf("row %q holds collapsed panels: keep rows open so that this test sees every panel", p.Title)
		}
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %d has no expression", p.Title, i)
			}
			exprs[tg.Expr] = "panel " + p.Title
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			exprs[a.Expr] = "annotation " + a.Name
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			_ = json.Unmarshal(v.Query, &q.Query)
		}
		exprs[q.Query] = "variable " + v.Name
	}
	return exprs
}

// exportedLabels returns every metric name a scrape holds (a histogram
// as its _bucket, _sum and _count series, a summary as its quantiles,
// _sum and _count) with the label names its series carry.
func exportedLabels(fams map[string]*dto.MetricFamily) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	add := func(name string, m *dto.Metric, extra ...string) {
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		for _, lp := range m.Label {
			out[name][lp.GetName()] = true
		}
		for _, l := range extra {
			out[name][l] = true
		}
	}
	for name, f := range fams {
		for _, m := range f.Metric {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				add(name+"_bucket", m, "le")
				add(name+"_sum", m)
				add(name+"_count", m)
			case dto.MetricType_SUMMARY:
				add(name, m, "quantile")
				add(name+"_sum", m)
				add(name+"_count", m)
			default:
				add(name, m)
			}
		}
	}
	return out
}

// TestGrafanaDashboard keeps deploy/grafana/corral.json from rotting
// silently: every metric its panels, annotations and variables query is
// one a live server exports, and every label they match on or group by
// is one of that metric's labels. A renamed or removed metric (or
// label) fails here instead of leaving an empty panel for the operator
// to find at 2 a.m. The server is the shared test server after real
// work: a team with a warm pool and a running sandbox, a sandbox with a
// network whose refused DNS queries overflow into an egress.summary,
// commands, a kill.
func TestGrafanaDashboard(t *testing.T) {
	need(t)
	exprs := dashboardExprs(t)
	ctx := context.Background()
	key := teamKey(t, "dashboard")
	c := corral.New(env.url, key)
	if _, err := c.SetPool(ctx, "base", 1, 1, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.SetPool(context.Background(), "base", 0, 0, 0); err != nil {
			t.Errorf("remove the pool: %v", err)
		}
	})
	// One sandbox runs while the test scrapes (the per-team gauges list
	// teams with sandboxes only).
	idle, err := c.Create(ctx, corral.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), idle.ID) })
	sb, err := c.Create(ctx, corral.CreateOptions{Network: "allow", Allow: []string{"allowed-dashboard.test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	// More refusals than the summariser records one by one in a window
	// (60): the rest go into an egress.summary when the network goes.
	if r, err := c.Exec(ctx, sb.ID, corral.ExecRequest{Command: "for i in $(seq 80); do getent hosts refused-$i.test; done; true", Timeout: 2 * time.Minute}); err != nil || r.ExitCode != 0 {
		t.Fatalf("refused lookups: %+v %v", r, err)
	}
	if _, err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	var have map[string]map[string]bool
	var missing []string
	check := func() bool {
		code, fams := scrape(t, env.key)
		if code != 200 {
			t.Fatalf("scrape: %d", code)
		}
		have, missing = exportedLabels(fams), nil
		for expr := range exprs {
			for _, m := range parsePromQL(expr).Metrics {
				if have[m] == nil && !slices.Contains(missing, m) {
					missing = append(missing, m)
				}
			}
		}
		return len(missing) == 0
	}
	deadline := time.Now().Add(60 * time.Second)
	for !check() && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("the dashboard queries %s, which the server does not export", m)
	}
	for expr, where := range exprs {
		u := parsePromQL(expr)
		if len(u.Metrics) == 0 {
			t.Errorf("%s: %q refers to no metric", where, expr)
		}
		for m, labels := range u.Matchers {
			for _, l := range labels {
				if have[m] != nil && !have[m][l] {
					t.Errorf("%s: %q matches label %s, which %s does not have", where, expr, l, m)
				}
			}
		}
		for _, l := range u.Grouping {
			found := false
			for _, m := range u.Metrics {
				found = found || have[m][l]
			}
			if !found {
				t.Errorf("%s: %q groups by %s, which none of %v has", where, expr, l, u.Metrics)
			}
		}
	}
}
