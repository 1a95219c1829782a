package results

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRoundTripAndMarkdown checks that a run survives the file (so runs
// can be compared later) and that the table prints each benchmark's
// ratio to its baseline of the same run, so a README ratio cannot come
// from two different runs.
func TestRoundTripAndMarkdown(t *testing.T) {
	r := &Run{
		Schema: Schema, Started: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), Commit: "abc",
		Machine: Machine{Kernel: "6.1", CPUs: 2, MemTotalMiB: 24576, Cgroup: "v1 (hybrid)", Go: "go1.26", Runc: "1.1.5"},
		Benchmarks: []Latency{
			{Name: "RawRuncRun", Label: "raw runc", N: 50, P50: 30, P95: 40, Group: "cold"},
			{Name: "RawRuncRunCorralSpec", Label: "raw runc, corral's spec", N: 50, P50: 45, P95: 50, Group: "cold"},
			{Name: "CreateFirstExec", Label: "corral create", N: 50, P50: 90, P95: 100, Baseline: "RawRuncRun", Also: []string{"RawRuncRunCorralSpec"}, Group: "cold"},
			{Name: "Kill", Label: "kill", N: 50, P50: 36, P95: 40, Group: "kill"},
		},
		Skipped: []Skip{{Name: "DockerRun", Reason: "dockerd is not installed"}},
		Density: &Density{Sandboxes: 50, PerSandboxPSSMiB: 11.5},
	}
	path := filepath.Join(t.TempDir(), "run.json")
	if err := r.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	got.Markdown(&buf)
	md := buf.String()
	for _, want := range []string{
		"| corral create | 50 | 90.0 | 100.0 | 0.0 | ×3.00 vs RawRuncRun; ×2.00 vs RawRuncRunCorralSpec | ×2.50; ×2.00 |",
		"| DockerRun | skipped: dockerd is not installed |",
		"| PSS of the sandbox's host processes (0.0 per sandbox) | 11.50 |",
		"commit `abc`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestReadRefusesOtherSchema checks that a file of another format is
// refused with a clear error rather than rendered as zeros.
func TestReadRefusesOtherSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.json")
	if err := os.WriteFile(path, []byte(`{"schema": 99}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), "schema 99") {
		t.Fatalf("Read of schema 99: %v, want a schema error", err)
	}
}
