package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rivo/uniseg"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestTermSafe: every kind of escape sequence and control character a
// string from the server may carry is removed or replaced, and ordinary
// text (also wide and combining characters) is left as it is.
func TestTermSafe(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"plain", "owner=alice team-7", "owner=alice team-7"},
		{"wide and combining", "数据=é🙂", "数据=é🙂"},
		{"SGR colour", "\x1b[31mred\x1b[0m", "red"},
		{"cursor up and erase line", "x\x1b[1A\x1b[2Kforged", "xforged"},
		{"cursor position with params", "a\x1b[12;40Hb", "ab"},
		{"private mode (alternate screen off)", "\x1b[?1049lz", "z"},
		{"OSC title, BEL", "\x1b]0;pwned\x07ok", "ok"},
		{"OSC 52 clipboard, ST", "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\ok", "ok"},
		{"OSC 8 hyperlink", "\x1b]8;;http://evil.test/\x1b\\click\x1b]8;;\x1b\\", "click"},
		{"DCS", "\x1bP+q544e\x1b\\ok", "ok"},
		{"unterminated OSC eats the rest", "ok\x1b]0;title", "ok"},
		{"two-byte ESC (RIS reset)", "\x1bcok", "ok"},
		{"lone ESC at the end", "ok\x1b", "ok"},
		{"8-bit CSI U+009B", "\u009b31mred", "?31mred"},
		{"OSC terminated by U+009C", "\x1b]0;t\u009cok", "ok"},
		{"raw byte 0x9b (invalid UTF-8)", "a\x9b31mb", "a?31mb"},
		{"C0 controls", "a\x00b\x07c\x08d", "a?b?c?d"},
		{"DEL", "a\x7fb", "a?b"},
		{"newline, CR and tab become spaces", "a\nb\rc\td", "a b c d"},
		{"line separator", "a\u2028b", "a b"},
		{"bidi override (Trojan Source)", "abc\u202edcba", "abc?dcba"},
		{"zero-width space", "a\u200bb", "a?b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := termSafe(tc.in); got != tc.want {
				t.Fatalf("termSafe(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// hostile are strings a sandbox's creator or the sandbox itself controls
// (metadata, agent names, hosts it tries to reach), each an attempt to
// drive the operator's terminal.
var hostile = []string{
	"\x1b[2J\x1b[H",  // clear the screen
	"\x1b[1A\x1b[2K", // move up, erase: hide the line above
	"\r\nrunning  aaaaaaaaaaaaaaaaaaaa  fake", // forge a row
	"\x1b]0;owned\x07",                        // window title
	"\x1b]52;c;cm0gLXJmIH4=\x1b\\",            // write the clipboard
	"\x1b]8;;http://evil.test/\x1b\\x",        // hyperlink
	"\x1bP$q\"p\x1b\\",                        // DCS query: the terminal answers into stdin
	"\u009b6n",                                // 8-bit CSI: cursor position report
	"\x9b6n",                                  // the same as a raw byte
	"\u202eevil",                              // bidi override
	"\x1b[?1049l",                             // leave the alternate screen
}

// TestTopRenderStripsTerminalEscapes is the regression test for a
// sandbox driving the operator's terminal through corral top: escape
// sequences and control characters in sandbox metadata, the agent name,
// the template, the task and in incident details (the host a sandbox
// tried to reach, a breaker's reason) must reach the screen as inert
// text. Every line of the frame, plain and bounded, must hold no ESC,
// no C0 or C1 control character, no DEL, no format character and only
// valid UTF-8, and no injected newline may add a line.
func TestTopRenderStripsTerminalEscapes(t *testing.T) {
	now := time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC)
	var rows []topRow
	var incidents []topIncident
	for i, h := range hostile {
		rows = append(rows, topRow{
			State: "running", ID: fmt.Sprintf("sb%018d", i), Template: "base" + h, Runtime: "runc", Tier: "light",
			Age: time.Minute, Left: 4 * time.Minute, CPU: float64(i), HasCPU: true, Mem: 1 << 20, HasMem: true,
			Task: "tk" + h, Agent: "agent" + h, Team: "t" + h,
			Metadata: map[string]string{"k" + h: "v" + h},
		})
		incidents = append(incidents, topIncident{ID: int64(i + 1), Time: now, Kind: "egress.http" + h, Sandbox: "sb" + h,
			Detail: "refused " + h + ".evil.test:443: not allowed"})
	}
	for _, team := range []string{"", "all"} {
		for _, l := range []topLayout{{}, {Width: 120, Height: 40}, {Width: 40, Height: 10}} {
			v := &topView{Now: now, Team: team, Interval: time.Second, Sort: "cpu", Filter: "\x1b[31m", Rows: rows,
				Incidents: incidents, Window: time.Hour, Err: "server said \x1b]0;x\x07", Editing: true, Input: "\x1b[H"}
			v.Filter = "" // a filter would hide the rows; Input shows the typed text
			lines, _ := renderTop(v, l)
			for n, line := range lines {
				if bad := unsafeRune(line); bad != "" {
					t.Errorf("team %q layout %+v: line %d holds %s: %q", team, l, n, bad, line)
				}
			}
			out := strings.Join(lines, "\n")
			if strings.Count(out, "\n") != len(lines)-1 {
				t.Errorf("a line holds a newline: %q", out)
			}
			if l.Height == 0 {
				// Unbounded: one table line per sandbox, none forged.
				for _, line := range lines {
					if strings.HasPrefix(line, "running  aaaa") {
						t.Errorf("a forged row: %q", line)
					}
				}
				for _, r := range rows {
					if !strings.Contains(out, r.ID) {
						t.Errorf("sandbox %s is missing from the frame", r.ID)
					}
				}
			}
		}
	}
}

// unsafeRune names the first rune of s a terminal could act on, or "".
func unsafeRune(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		switch {
		case r == 0x1b:
			return "ESC"
		case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
			return fmt.Sprintf("control %U", r)
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200b:
			return fmt.Sprintf("format %U", r)
		}
	}
	return ""
}

// TestTopRenderTruncation: a cell longer than its column (attacker-sized
// metadata, a long agent name) is cut with "…", wide characters count
// two columns, and a bounded frame never exceeds the terminal's width
// or height.
func TestTopRenderTruncation(t *testing.T) {
	now := time.Now()
	long := strings.Repeat("x", 10000)
	rows := []topRow{
		{State: "running", ID: "aaaaaaaaaaaaaaaaaaaa", Template: "base", Runtime: "runc", Tier: "light", Age: time.Hour,
			Agent: long, Task: "tk1", Metadata: map[string]string{"blob": long}},
		{State: "paused", ID: "bbbbbbbbbbbbbbbbbbbb", Template: "数据数据数据数据数据数据数据数据数据数据", Runtime: "gvisor", Tier: "heavy", Age: time.Minute, Left: -1},
	}
	var incidents []topIncident
	for i := range 50 {
		incidents = append(incidents, topIncident{ID: int64(i), Time: now, Kind: "watchdog.oom", Sandbox: "aaaaaaaaaaaaaaaaaaaa", Detail: long})
	}
	tests := []struct {
		name   string
		layout topLayout
	}{
		{"plain", topLayout{}},
		{"80x24", topLayout{Width: 79, Height: 24}},
		{"narrow", topLayout{Width: 30, Height: 8}},
		{"tiny", topLayout{Width: 5, Height: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := &topView{Now: now, Interval: time.Second, Sort: "cpu", Rows: rows, Incidents: incidents, Window: time.Hour}
			lines, _ := renderTop(v, tc.layout)
			if tc.layout.Height > 0 && len(lines) > tc.layout.Height {
				t.Errorf("%d lines for a height of %d", len(lines), tc.layout.Height)
			}
			for _, line := range lines {
				w := uniseg.StringWidth(line)
				if tc.layout.Width > 0 && w > tc.layout.Width {
					t.Errorf("line of width %d on a %d-column screen: %q", w, tc.layout.Width, line)
				}
				if w > 400 {
					t.Errorf("a line of %d columns: cells are not bounded", w)
				}
			}
			out := strings.Join(lines, "\n")
			if tc.layout.Width == 0 {
				if !strings.Contains(out, "blob="+strings.Repeat("x", 54)+"…") {
					t.Errorf("long metadata not cut to its 60-column cell with an ellipsis:\n%s", out)
				}
				if !strings.Contains(out, strings.Repeat("数据", 5)+"数…") {
					t.Errorf("wide template not cut to 24 columns:\n%s", out)
				}
			}
		})
	}
}

// TestTopRenderTotalsSortFilter: the totals count the scope's sandboxes
// and tripped breakers; rows sort by CPU, memory or age and the filter
// matches any field, metadata included.
func TestTopRenderTotalsSortFilter(t *testing.T) {
	now := time.Now()
	rows := []topRow{
		{State: "running", ID: "a-cpu", Age: time.Minute, CPU: 90, HasCPU: true, Mem: 10 << 20, HasMem: true, Agent: "crawler"},
		{State: "running", ID: "b-mem", Age: 2 * time.Minute, CPU: 5, HasCPU: true, Mem: 900 << 20, HasMem: true, Metadata: map[string]string{"owner": "bob"}},
		{State: "paused", ID: "c-old", Age: time.Hour, Left: -1, Mem: 20 << 20, HasMem: true},
	}
	order := func(lines []string) []string {
		var ids []string
		for _, l := range lines {
			for _, id := range []string{"a-cpu", "b-mem", "c-old"} {
				if strings.Contains(l, id) {
					ids = append(ids, id)
				}
			}
		}
		return ids
	}
	tests := []struct {
		sort, filter string
		want         []string
	}{
		{"cpu", "", []string{"a-cpu", "b-mem", "c-old"}},
		{"mem", "", []string{"b-mem", "c-old", "a-cpu"}},
		{"age", "", []string{"c-old", "b-mem", "a-cpu"}},
		{"cpu", "owner=bob", []string{"b-mem"}},
		{"cpu", "CRAWL", []string{"a-cpu"}},
		{"cpu", "paused", []string{"c-old"}},
		{"cpu", "nothing-matches", nil},
	}
	for _, tc := range tests {
		t.Run(tc.sort+"/"+tc.filter, func(t *testing.T) {
			v := &topView{Now: now, Interval: time.Second, Sort: tc.sort, Filter: tc.filter, Rows: rows, Tripped: 2, Window: time.Hour}
			lines, header := renderTop(v, topLayout{})
			if got := order(lines[header+1:]); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("rows %v, want %v\n%s", got, tc.want, strings.Join(lines, "\n"))
			}
			totals := lines[1]
			for _, want := range []string{"2 running, 1 paused", "cpu 95%", "memory 930M", "tripped breakers: 2"} {
				if !strings.Contains(totals, want) {
					t.Errorf("totals %q lack %q", totals, want)
				}
			}
		})
	}
}

// TestTopRows: the list's fields reach the row; a paused sandbox shows no
// CPU and no lifetime left (its clock is stopped), and the agent comes
// from the sandbox's task.
func TestTopRows(t *testing.T) {
	now := time.Now()
	list := []*corral.Sandbox{
		{ID: "r", State: "running", Task: "tk1", CreatedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Minute),
			Resources: corral.Resources{MemoryMB: 256}, Current: &corral.Sample{CPUPercent: 42, MemoryBytes: 7 << 20}},
		{ID: "p", State: "paused", CreatedAt: now, ExpiresAt: now.Add(time.Hour), Current: &corral.Sample{CPUPercent: 99, MemoryBytes: 1}},
		{ID: "n", State: "running", CreatedAt: now, ExpiresAt: now.Add(-time.Second)},
	}
	rows := topRows(list, map[string]string{"tk1": "crawler"}, now)
	r, p, n := rows[0], rows[1], rows[2]
	if !r.HasCPU || r.CPU != 42 || r.Mem != 7<<20 || r.MemLimit != 256<<20 || r.Agent != "crawler" || r.Left != time.Minute {
		t.Errorf("running row %+v", r)
	}
	if p.HasCPU || !p.HasMem || p.Left >= 0 {
		t.Errorf("paused row %+v: want no CPU, memory kept, no lifetime left", p)
	}
	if n.HasCPU || n.HasMem || n.Left != 0 {
		t.Errorf("row without a sample %+v", n)
	}
}

// TestIncidentOf: breaker trips, runaways, OOM kills, refused egress and
// refusal summaries are incidents; allowed egress and other events are
// not.
func TestIncidentOf(t *testing.T) {
	tests := []struct {
		kind   string
		data   any
		want   bool
		detail string
	}{
		{"task.breaker_open", map[string]any{"code": "budget_exhausted", "budget": "max_calls", "reason": "30 of 30"}, true, "budget_exhausted max_calls: 30 of 30"},
		{"watchdog.cpu_runaway", map[string]any{"message": "CPU-bound for 30s"}, true, "CPU-bound for 30s"},
		{"watchdog.oom", map[string]any{"message": "1 OOM kill"}, true, "1 OOM kill"},
		{"egress.http", map[string]any{"host": "evil.test", "port": 443, "verdict": "refused", "reason": "not in allowlist"}, true, "refused evil.test:443: not in allowlist"},
		{"egress.dns", map[string]any{"host": "x.test", "verdict": "refused", "reason": "blocked"}, true, "refused x.test: blocked"},
		{"egress.http", map[string]any{"host": "api.github.com", "port": 443, "verdict": "allowed"}, false, ""},
		{"egress.summary", map[string]any{"suppressed": 99}, true, "99 more refusals counted"},
		{"command", map[string]any{"command": "ls"}, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.kind+"/"+tc.detail, func(t *testing.T) {
			b, _ := json.Marshal(tc.data)
			in, ok := incidentOf(&corral.Event{ID: 7, Kind: tc.kind, Sandbox: "sb", Data: b})
			if ok != tc.want || (ok && in.Detail != tc.detail) {
				t.Fatalf("incidentOf(%s %s) = %+v, %v; want %v %q", tc.kind, b, in, ok, tc.want, tc.detail)
			}
		})
	}
}

// TestTopKey: the keys sort, filter (typed, applied with Enter,
// cancelled with Esc, cleared with Esc) and quit; an arrow key's escape
// sequence does nothing.
func TestTopKey(t *testing.T) {
	v := &topView{Sort: "cpu"}
	steps := []struct {
		in           string
		quit         bool
		sort, filter string
		editing      bool
		input        string
	}{
		{"m", false, "mem", "", false, ""},
		{"a", false, "age", "", false, ""},
		{"\x1b[A", false, "age", "", false, ""},
		{"/", false, "age", "", true, ""},
		{"crawlq", false, "age", "", true, "crawlq"},
		{"\x7f", false, "age", "", true, "crawl"},
		{"\r", false, "age", "crawl", false, "crawl"},
		{"/x", false, "age", "crawl", true, "crawlx"},
		{"\x1b", false, "age", "crawl", false, "crawlx"},
		{"\x1b", false, "age", "", false, "crawlx"},
		{"c", false, "cpu", "", false, "crawlx"},
		{"q", true, "cpu", "", false, "crawlx"},
	}
	for i, s := range steps {
		quit := topKey(v, []byte(s.in))
		if quit != s.quit || v.Sort != s.sort || v.Filter != s.filter || v.Editing != s.editing || v.Input != s.input {
			t.Fatalf("step %d (%q): quit %v %+v; want quit %v sort %q filter %q editing %v input %q", i, s.in, quit, v, s.quit, s.sort, s.filter, s.editing, s.input)
		}
	}
	if !topKey(&topView{}, []byte{0x03}) {
		t.Error("Ctrl-C does not quit")
	}
}

// fakeAuditLog is an in-memory audit log answering like GET /v1/audit
// (oldest first; kind family, since, after, limit), for the incident
// reader's unit test; TestCLITop reads the real one.
type fakeAuditLog struct {
	events []corral.Event
	calls  int
}

func (f *fakeAuditLog) audit(_ context.Context, q corral.AuditQuery) ([]corral.Event, error) {
	f.calls++
	var out []corral.Event
	for _, e := range f.events {
		if (e.Kind != q.Kind && !strings.HasPrefix(e.Kind, q.Kind+".")) || e.ID <= q.After || e.Time.Before(q.Since) {
			continue
		}
		if out = append(out, e); len(out) == q.Limit {
			break
		}
	}
	return out, nil
}

func (f *fakeAuditLog) add(n int, from time.Time, step time.Duration) {
	for i := range n {
		id := int64(len(f.events) + 1)
		f.events = append(f.events, corral.Event{ID: id, Time: from.Add(time.Duration(i) * step), Kind: "egress.dns", Sandbox: "sb",
			Data: json.RawMessage(fmt.Sprintf(`{"host":"h%d.test","verdict":"refused","reason":"flood"}`, id))})
	}
}

// TestTopIncidentsAfterAFlood: when refused egress filled the window
// with more events than a refresh reads, the first refresh still shows
// the latest incidents (not the oldest of the window), with a bounded
// number of requests, and later refreshes follow the log from there.
func TestTopIncidentsAfterAFlood(t *testing.T) {
	now := time.Now()
	log := &fakeAuditLog{}
	log.add(20000, now.Add(-time.Hour), 180*time.Millisecond)
	s := &topSource{window: time.Hour, audit: log.audit}
	if err := s.readIncidents(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	last := s.incidents[len(s.incidents)-1]
	if len(s.incidents) != topMaxIncidents || last.ID != 20000 {
		t.Fatalf("first refresh: %d incidents, the latest %d; want %d ending with event 20000", len(s.incidents), last.ID, topMaxIncidents)
	}
	if log.calls > 2+topBisect+len(topIncidentKinds) {
		t.Errorf("first refresh made %d requests", log.calls)
	}
	log.add(1500, now, time.Millisecond)
	if err := s.readIncidents(context.Background(), now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if last := s.incidents[len(s.incidents)-1]; last.ID != 21500 || len(s.incidents) != topMaxIncidents {
		t.Fatalf("second refresh: latest incident %d, %d kept; want 21500, %d", last.ID, len(s.incidents), topMaxIncidents)
	}
	for i := 1; i < len(s.incidents); i++ {
		if s.incidents[i].ID != s.incidents[i-1].ID+1 {
			t.Fatalf("incidents not the consecutive latest: %d after %d", s.incidents[i].ID, s.incidents[i-1].ID)
		}
	}
}
