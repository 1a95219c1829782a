package main

import (
	"strings"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestPrintUsage checks the table of `corral usage`: a header with the
// grouping's key columns and the amounts, one line per row with "-" for
// an empty key, and a total line; the window the server used is named.
func TestPrintUsage(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	rep := &corral.UsageReport{Team: "red", Since: &since, By: corral.UsageByTask,
		Totals: corral.UsageAmounts{CPUSeconds: 3.5, Commands: 5, EgressBytes: 1234, Sandboxes: 2},
		Rows: []corral.UsageRow{
			{Team: "red", Agent: "alice", Task: "t1", UsageAmounts: corral.UsageAmounts{CPUSeconds: 3, Commands: 4, EgressBytes: 1234, Sandboxes: 1}},
			{Team: "red", Task: "t2", UsageAmounts: corral.UsageAmounts{CPUSeconds: 0.5, Commands: 1, Sandboxes: 1}},
		}}
	var b strings.Builder
	if err := printUsage(&b, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "team red, since ") {
		t.Fatalf("output:\n%s", b.String())
	}
	for i, want := range [][]string{
		{"TEAM", "AGENT", "TASK", "CPU_S", "MEM_GIB_S", "SANDBOX_S", "EGRESS_BYTES", "COMMANDS", "SANDBOXES"},
		{"red", "alice", "t1", "3.000", "0.000", "0.0", "1234", "4", "1"},
		{"red", "-", "t2", "0.500", "0.000", "0.0", "0", "1", "1"},
		{"total", "-", "-", "3.500", "0.000", "0.0", "1234", "5", "2"},
	} {
		if got := strings.Fields(lines[i+1]); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("line %d: %q, want %q", i+1, got, want)
		}
	}
}
