package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rivo/uniseg"
)

// topRow is one sandbox line of corral top.
type topRow struct {
	Team, State, ID, Template, Runtime, Tier string
	Age                                      time.Duration
	// Left is the lifetime left; negative when the clock is stopped
	// (a paused sandbox).
	Left time.Duration
	// CPU is the CPU used in percent of one core; HasCPU is false when
	// there is no sample (or the sandbox is paused).
	CPU    float64
	HasCPU bool
	// Mem is the memory used now, MemLimit the sandbox's limit (bytes);
	// HasMem is false when there is no sample.
	Mem, MemLimit int64
	HasMem        bool
	Task, Agent   string
	Metadata      map[string]string
}

// topIncident is one line of the incident list: a breaker trip, a CPU
// runaway, an OOM kill or refused egress.
type topIncident struct {
	ID      int64
	Time    time.Time
	Kind    string
	Sandbox string
	Task    string
	Detail  string
}

// topView is everything one frame of corral top shows.
type topView struct {
	Now      time.Time
	Team     string // the --team asked for ("" is the key's own team)
	Interval time.Duration
	Sort     string // cpu, mem or age
	Filter   string
	// Editing is true while the operator types a filter; Input is what
	// was typed so far.
	Editing bool
	Input   string
	Rows    []topRow
	// Tripped counts the tasks of the scope whose breaker is open.
	Tripped int
	// Incidents are the latest incidents, oldest first.
	Incidents []topIncident
	Window    time.Duration
	// Err is the last refresh's error ("" when it worked).
	Err string
}

// topLayout bounds a frame: Width columns and Height lines; 0 leaves
// that dimension unbounded (the plain snapshot).
type topLayout struct{ Width, Height int }

// topSorts are the sorting keys of corral top.
var topSorts = []string{"cpu", "mem", "age"}

// topColumn is a column of the sandbox table: its header, its widest
// cell (longer cells are cut) and how to print a row's cell.
type topColumn struct {
	name  string
	max   int
	right bool
	cell  func(r *topRow) string
}

// topColumns returns the table's columns; every team's view (team
// "all") starts with the team.
func topColumns(allTeams bool) []topColumn {
	cols := []topColumn{
		{"STATE", 7, false, func(r *topRow) string { return r.State }},
		{"ID", 24, false, func(r *topRow) string { return r.ID }},
		{"TEMPLATE", 24, false, func(r *topRow) string { return r.Template }},
		{"RUNTIME", 7, false, func(r *topRow) string { return r.Runtime }},
		{"TIER", 6, false, func(r *topRow) string { return r.Tier }},
		{"AGE", 7, true, func(r *topRow) string { return humanDuration(r.Age) }},
		{"LEFT", 7, true, func(r *topRow) string {
			if r.Left < 0 {
				return "-"
			}
			return humanDuration(r.Left)
		}},
		{"CPU%", 6, true, func(r *topRow) string {
			if !r.HasCPU {
				return "-"
			}
			return fmtPercent(r.CPU)
		}},
		{"MEM", 13, true, func(r *topRow) string {
			if !r.HasMem {
				return "-"
			}
			if r.MemLimit > 0 {
				return fmtBytes(r.Mem) + "/" + fmtBytes(r.MemLimit)
			}
			return fmtBytes(r.Mem)
		}},
		{"TASK", 24, false, func(r *topRow) string { return r.Task }},
		{"AGENT", 20, false, func(r *topRow) string { return r.Agent }},
		{"METADATA", 60, false, func(r *topRow) string { return fmtMetadata(r.Metadata) }},
	}
	if allTeams {
		cols = append([]topColumn{{"TEAM", 16, false, func(r *topRow) string { return r.Team }}}, cols...)
	}
	return cols
}

// renderTop lays out one frame as lines of plain text: a title, the
// totals, the sandbox table (filtered and sorted as v says) and the
// latest incidents. Every string that came from the server is passed
// through termSafe, so the lines hold no control character whatever a
// sandbox put in its metadata or the hosts it tried. headerLine is the
// index of the table's column header (for the caller to highlight).
func renderTop(v *topView, l topLayout) (lines []string, headerLine int) {
	scope := "own team"
	switch v.Team {
	case "":
	case "all":
		scope = "every team"
	default:
		scope = "team " + v.Team
	}
	title := fmt.Sprintf("corral top · %s · %s · every %s · sort %s", scope, v.Now.Local().Format(time.TimeOnly), v.Interval, v.Sort)
	if v.Filter != "" {
		title += fmt.Sprintf(" · filter %q", v.Filter)
	}
	lines = append(lines, title)

	var running, paused int
	var cpu float64
	var mem int64
	for i := range v.Rows {
		r := &v.Rows[i]
		switch r.State {
		case "running":
			running++
		case "paused":
			paused++
		}
		if r.HasCPU {
			cpu += r.CPU
		}
		if r.HasMem {
			mem += r.Mem
		}
	}
	lines = append(lines, fmt.Sprintf("sandboxes: %d running, %d paused · cpu %s%% · memory %s · tripped breakers: %d · incidents (%s): %d",
		running, paused, fmtPercent(cpu), fmtBytes(mem), v.Tripped, humanDuration(v.Window), len(v.Incidents)))
	if v.Err != "" {
		lines = append(lines, "error: "+v.Err)
	}
	if v.Editing {
		lines = append(lines, "filter: "+v.Input+"_  (Enter applies, Esc cancels)")
	}

	rows := filterRows(v.Rows, v.Filter)
	sortRows(rows, v.Sort)
	cols := topColumns(v.Team == "all")
	cells := make([][]string, len(rows))
	widths := make([]int, len(cols))
	for i, c := range cols {
		widths[i] = uniseg.StringWidth(c.name)
	}
	for j := range rows {
		cells[j] = make([]string, len(cols))
		for i, c := range cols {
			s := truncWidth(termSafe(c.cell(&rows[j])), c.max)
			cells[j][i] = s
			widths[i] = max(widths[i], uniseg.StringWidth(s))
		}
	}
	// On a narrow screen the columns give way in this order, each down
	// to its minimum; what is still too wide is cut at the end of the
	// line.
	if l.Width > 0 {
		total := -2
		for _, w := range widths {
			total += w + 2
		}
		for _, give := range []struct {
			name string
			min  int
		}{{"METADATA", 8}, {"TASK", 10}, {"TEMPLATE", 8}, {"AGENT", 8}, {"TEAM", 8}} {
			for i, c := range cols {
				if c.name != give.name || total <= l.Width {
					continue
				}
				cut := min(total-l.Width, max(widths[i]-give.min, 0))
				widths[i] -= cut
				total -= cut
			}
		}
	}
	row := func(vals []string) string {
		var b strings.Builder
		for i, s := range vals {
			s = truncWidth(s, widths[i])
			pad := strings.Repeat(" ", widths[i]-uniseg.StringWidth(s))
			if i > 0 {
				b.WriteString("  ")
			}
			if cols[i].right {
				b.WriteString(pad + s)
			} else if i < len(vals)-1 {
				b.WriteString(s + pad)
			} else {
				b.WriteString(s)
			}
		}
		return b.String()
	}
	lines = append(lines, "")
	headerLine = len(lines)
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	lines = append(lines, row(names))

	// With a bounded height the incidents keep a few lines and the
	// table gets the rest.
	incidents := v.Incidents
	tableRows := len(cells)
	if l.Height > 0 {
		room := l.Height - len(lines) - 2 // blank line and incident title
		want := min(len(incidents), max(3, l.Height/4))
		if want == 0 {
			want = 1 // "none"
		}
		tableRows = min(tableRows, max(room-want, 1))
		if tableRows < len(cells) && tableRows > 1 {
			tableRows-- // room for the "more" line
		}
		if keep := max(room-tableRows-1, 1); len(incidents) > keep {
			incidents = incidents[len(incidents)-keep:]
		}
	}
	for j := 0; j < tableRows; j++ {
		lines = append(lines, row(cells[j]))
	}
	if tableRows < len(cells) {
		lines = append(lines, fmt.Sprintf("… %d more", len(cells)-tableRows))
	}
	if len(rows) < len(v.Rows) {
		lines = append(lines, fmt.Sprintf("(%d of %d sandboxes match the filter)", len(rows), len(v.Rows)))
	}
	if len(v.Rows) == 0 {
		lines = append(lines, "(no running or paused sandboxes)")
	}

	lines = append(lines, "", fmt.Sprintf("latest incidents (breaker trips, cpu_runaway, oom, refused egress; last %s):", humanDuration(v.Window)))
	if len(incidents) == 0 {
		lines = append(lines, "  none")
	}
	for i := len(incidents) - 1; i >= 0; i-- { // newest first
		in := incidents[i]
		who := in.Sandbox
		if who == "" {
			who = "task " + in.Task
		}
		lines = append(lines, "  "+in.Time.Local().Format(time.TimeOnly)+"  "+truncWidth(termSafe(in.Kind), 22)+"  "+
			truncWidth(termSafe(who), 26)+"  "+truncWidth(termSafe(in.Detail), 200))
	}
	for i, s := range lines {
		s = termSafe(s)
		if l.Width > 0 {
			s = truncWidth(s, l.Width)
		}
		lines[i] = s
	}
	if l.Height > 0 && len(lines) > l.Height {
		lines = lines[:l.Height]
	}
	return lines, headerLine
}

// filterRows returns the rows one of whose cells (state, id, team,
// template, runtime, tier, task, agent, a metadata key=value) contains
// filter, case-insensitively; all of them for an empty filter.
func filterRows(rows []topRow, filter string) []topRow {
	out := make([]topRow, 0, len(rows))
	f := strings.ToLower(filter)
	for _, r := range rows {
		if f == "" {
			out = append(out, r)
			continue
		}
		fields := []string{r.State, r.ID, r.Team, r.Template, r.Runtime, r.Tier, r.Task, r.Agent}
		for k, v := range r.Metadata {
			fields = append(fields, k+"="+v)
		}
		for _, s := range fields {
			if strings.Contains(strings.ToLower(s), f) {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// sortRows orders rows by key: cpu and mem highest first, age oldest
// first; ties by id.
func sortRows(rows []topRow, key string) {
	slices.SortStableFunc(rows, func(a, b topRow) int {
		var c int
		switch key {
		case "mem":
			c = cmpDesc(a.Mem, b.Mem)
		case "age":
			c = cmpDesc(a.Age, b.Age)
		default:
			c = cmpDesc(a.CPU, b.CPU)
		}
		if c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

func cmpDesc[T int64 | float64 | time.Duration](a, b T) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// truncWidth cuts s to at most w terminal columns (by grapheme cluster,
// wide characters counting two), ending in "…" when it cut.
func truncWidth(s string, w int) string {
	if w <= 0 {
		return ""
	}
	if uniseg.StringWidth(s) <= w {
		return s
	}
	var b strings.Builder
	used := 0
	state := -1
	for s != "" {
		var cluster string
		var cw int
		cluster, s, cw, state = uniseg.FirstGraphemeClusterInString(s, state)
		if used+cw > w-1 {
			break
		}
		b.WriteString(cluster)
		used += cw
	}
	return b.String() + "…"
}

// fmtMetadata prints metadata as k=v pairs sorted by key.
func fmtMetadata(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + md[k]
	}
	return strings.Join(parts, ",")
}

// fmtPercent prints a CPU percentage: one decimal below 10.
func fmtPercent(p float64) string {
	if p < 10 {
		return fmt.Sprintf("%.1f", p)
	}
	return fmt.Sprintf("%.0f", p)
}

// fmtBytes prints a size in binary units: 512K, 41M, 1.5G.
func fmtBytes(n int64) string {
	const k = 1024
	switch {
	case n < k:
		return fmt.Sprintf("%dB", n)
	case n < k*k:
		return fmt.Sprintf("%.0fK", float64(n)/k)
	case n < k*k*k:
		return fmt.Sprintf("%.0fM", float64(n)/(k*k))
	case n < 10*k*k*k:
		return fmt.Sprintf("%.1fG", float64(n)/(k*k*k))
	}
	return fmt.Sprintf("%.0fG", float64(n)/(k*k*k))
}
