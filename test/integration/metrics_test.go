package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads GET /metrics with key (as a Bearer token, the way
// Prometheus sends credentials) and returns the status and the parsed
// families.
func scrape(t *testing.T, key string) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	req, _ := http.NewRequest("GET", env.url+"/metrics", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return resp.StatusCode, fams
}

// value returns the value of the series of family name whose labels
// include every pair of labels (0 when there is none).
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// TestMetrics: GET /metrics needs an API key; with one it serves the
// Prometheus text format, and a create and a kill move the counters, the
// create histogram and the gauges by what happened.
func TestMetrics(t *testing.T) {
	need(t)
	for _, key := range []string{"", "e2b_" + strings.Repeat("0", 40)} {
		if code, _ := scrape(t, key); code != http.StatusUnauthorized {
			t.Fatalf("/metrics with key %q: status %d, want 401", key, code)
		}
	}
	_, before := scrape(t, env.key)
	id := create(t, nil)
	mustSh(t, id, "true")
	_, during := scrape(t, env.key)
	call(t, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	_, after := scrape(t, env.key)

	checks := []struct {
		what     string
		from, to map[string]*dto.MetricFamily
		name     string
		labels   []string
		atLeast  float64
	}{
		{"created events", before, during, "corral_events_total", []string{"kind", "sandbox.created", "outcome", "template"}, 1},
		{"create histogram", before, during, "corral_sandbox_create_seconds", []string{"source", "template"}, 1},
		{"ended events", during, after, "corral_events_total", []string{"kind", "sandbox.ended", "outcome", "killed"}, 1},
	}
	for _, c := range checks {
		if d := value(c.to, c.name, c.labels...) - value(c.from, c.name, c.labels...); d < c.atLeast {
			t.Errorf("%s: %s%v grew by %v, want at least %v", c.what, c.name, c.labels, d, c.atLeast)
		}
	}
	if v := value(during, "corral_sandboxes", "state", "running"); v < 1 {
		t.Errorf("corral_sandboxes{state=running} = %v while a sandbox runs", v)
	}
	if v := value(during, "corral_admission_running"); v < 1 {
		t.Errorf("corral_admission_running = %v while a sandbox runs", v)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "corral_volumes", "corral_volume_used_bytes"} {
		if after[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
}
