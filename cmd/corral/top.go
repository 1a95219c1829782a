package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	corral "github.com/corralhq/corral/sdk/go"
)

// Bounds of corral top.
const (
	// topMinInterval is the shortest refresh interval: each refresh is
	// three to six requests.
	topMinInterval = 250 * time.Millisecond
	// topMaxIncidents is how many incidents corral top keeps.
	topMaxIncidents = 200
	// topAuditPage and topAuditPages bound what one refresh reads of
	// the audit log per incident kind.
	topAuditPage  = 1000
	topAuditPages = 5
	// topBisect bounds the requests that find where the latest page of
	// a full window starts (an hour to within a second).
	topBisect = 12
	// topMaxFilter bounds the filter typed on the screen.
	topMaxFilter = 128
)

// topIncidentKinds are the audit kinds (and families) corral top reads
// incidents from.
var topIncidentKinds = []string{"task.breaker_open", "watchdog.cpu_runaway", "watchdog.oom", "egress"}

// newTopCmd is `corral top`: the live sandbox list for an operator's
// terminal.
func newTopCmd(g *clientGlobals) *cobra.Command {
	var intervalArg, windowArg string
	var once bool
	var sortKey, filter, team string
	var width int
	cmd := &cobra.Command{
		Use:   "top [--interval 1s] [--sort cpu|mem|age] [--filter TEXT] [--team T|all] [--once]",
		Short: "Show the live sandbox list: CPU, memory, lifetime, tasks, breakers and the latest incidents",
		Long: `Shows the running and paused sandboxes of the key's team, refreshed every
second: state, id, template, runtime, tier, age, lifetime left, CPU (percent
of one core) and memory now, task, agent and metadata, with totals (running,
paused, CPU, memory, tripped breakers) and the latest incidents of the last
hour (breaker trips, cpu_runaway, oom kills, refused egress).

Keys: c, m, a sort by CPU, memory or age; / types a filter (Enter applies,
Esc cancels), Esc clears it; q or Ctrl-C quits.

With --once, or when stdin or stdout is not a terminal, it prints one plain snapshot
and exits (for scripts and logs). Everything the sandboxes control (their
metadata, agent names, the hosts they tried) is printed without control
characters or escape sequences.`,
		Example: `  corral top
  corral top --sort mem --filter owner=alice
  corral top --once --team all`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: g.call(func(ctx context.Context, c *corral.Client, cmd *cobra.Command, args []string) error {
			if !slices.Contains(topSorts, sortKey) {
				return usageError(cmd, "invalid --sort %q: use cpu, mem or age", sortKey)
			}
			interval, err := parseDurationArg(intervalArg)
			if err != nil || interval < topMinInterval {
				return usageError(cmd, "--interval %q: give at least %s (e.g. 1s, 2, 500ms)", intervalArg, topMinInterval)
			}
			window, err := parseDurationArg(windowArg)
			if err != nil || window <= 0 {
				return usageError(cmd, "--incidents %q: give a positive duration (e.g. 1h, 30m)", windowArg)
			}
			if width < 0 {
				return usageError(cmd, "--width: must not be negative")
			}
			src := &topSource{c: c, team: team, window: window}
			base := topView{Team: team, Interval: interval, Sort: sortKey, Filter: filter, Window: window}
			outFd, inFd := int(os.Stdout.Fd()), int(os.Stdin.Fd())
			if once || !term.IsTerminal(outFd) || !term.IsTerminal(inFd) {
				v := base
				if err := src.refresh(ctx, &v); err != nil {
					return err
				}
				lines, _ := renderTop(&v, topLayout{Width: width})
				_, err := io.WriteString(os.Stdout, strings.Join(lines, "\n")+"\n")
				return err
			}
			return runTopTTY(ctx, src, base, inFd, outFd)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&intervalArg, "interval", "1s", "refresh interval (at least 250ms; a plain number is seconds)")
	f.BoolVar(&once, "once", false, "print one plain snapshot and exit (the default when stdout is not a terminal)")
	f.StringVar(&sortKey, "sort", "cpu", "sort by cpu, mem (highest first) or age (oldest first)")
	f.StringVar(&filter, "filter", "", "show the sandboxes one of whose fields (id, state, template, task, agent, key=value of metadata, ...) contains TEXT")
	f.StringVar(&team, "team", "", "another team, or all (admin keys only; default: the key's team)")
	f.StringVar(&windowArg, "incidents", "1h", "how far back the incident list starts")
	f.IntVar(&width, "width", 0, "with --once: cut lines to this many columns (0: no cut; cells are bounded anyway)")
	return cmd
}

// topSource reads what corral top shows: the sandboxes, the tasks
// (agents and breakers) and, following the audit log, the incidents.
type topSource struct {
	c      *corral.Client
	team   string
	window time.Duration

	// audit reads the audit log (the client's Audit; a test's fake).
	audit func(context.Context, corral.AuditQuery) ([]corral.Event, error)

	cursors   map[string]int64 // per incident kind: the last event id read
	incidents []topIncident    // oldest first, at most topMaxIncidents
}

// refresh fills v's rows, tripped count and incidents from the server.
func (s *topSource) refresh(ctx context.Context, v *topView) error {
	now := time.Now()
	list, err := s.c.List(ctx, corral.ListOptions{Team: s.team})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	tasks, err := s.c.Tasks(ctx, corral.TaskQuery{Team: s.team})
	if err != nil {
		return fmt.Errorf("list tasks: %w", err)
	}
	if err := s.readIncidents(ctx, now); err != nil {
		return fmt.Errorf("read the audit log: %w", err)
	}
	agents := make(map[string]string, len(tasks))
	tripped := 0
	for _, t := range tasks {
		agents[t.ID] = t.Agent
		if t.Breaker.Open {
			tripped++
		}
	}
	v.Now, v.Rows, v.Tripped = now, topRows(list, agents, now), tripped
	v.Incidents = slices.Clone(s.incidents)
	return nil
}

// topRows turns the sandbox list into rows.
func topRows(list []*corral.Sandbox, agents map[string]string, now time.Time) []topRow {
	rows := make([]topRow, 0, len(list))
	for _, sb := range list {
		r := topRow{Team: sb.Team, State: sb.State, ID: sb.ID, Template: sb.Template, Runtime: sb.Runtime, Tier: sb.Tier,
			Age: now.Sub(sb.CreatedAt), Left: max(sb.ExpiresAt.Sub(now), 0), Task: sb.Task, Agent: agents[sb.Task],
			Metadata: sb.Metadata, MemLimit: sb.Resources.MemoryMB << 20}
		if sb.State == corral.StatePaused {
			r.Left = -1
		}
		if cur := sb.Current; cur != nil {
			r.Mem, r.HasMem = cur.MemoryBytes, true
			if sb.State != corral.StatePaused {
				r.CPU, r.HasCPU = cur.CPUPercent, true
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// readIncidents follows the audit log, one cursor per incident kind: the
// first read of a kind starts at the latest page of its window (the
// latest incidents matter, also when a flood filled the window), later
// ones read what came after, at most topAuditPages pages a refresh.
func (s *topSource) readIncidents(ctx context.Context, now time.Time) error {
	if s.cursors == nil {
		s.cursors = map[string]int64{}
	}
	if s.audit == nil {
		s.audit = s.c.Audit
	}
	for _, kind := range topIncidentKinds {
		for page := 0; page < topAuditPages; page++ {
			var evs []corral.Event
			var err error
			if after, ok := s.cursors[kind]; ok {
				evs, err = s.audit(ctx, corral.AuditQuery{Team: s.team, Kind: kind, Limit: topAuditPage, After: after})
			} else {
				evs, err = s.latestPage(ctx, kind, now)
			}
			if err != nil {
				return err
			}
			if len(evs) > 0 {
				// Without events in the window the next refresh asks by
				// time again; from the first one on, after it.
				s.cursors[kind] = evs[len(evs)-1].ID
			}
			for i := range evs {
				if in, ok := incidentOf(&evs[i]); ok {
					s.incidents = append(s.incidents, in)
				}
			}
			if len(evs) < topAuditPage {
				break
			}
		}
	}
	slices.SortFunc(s.incidents, func(a, b topIncident) int { return cmp.Compare(a.ID, b.ID) })
	s.incidents = slices.CompactFunc(s.incidents, func(a, b topIncident) bool { return a.ID == b.ID })
	if n := len(s.incidents); n > topMaxIncidents {
		s.incidents = slices.Delete(s.incidents, 0, n-topMaxIncidents)
	}
	return nil
}

// latestPage returns the events of kind from the latest start within
// the window from which they fit one page (the audit API lists oldest
// first): the whole window when it fits, else a start found by halving
// the time range, at most topBisect times.
func (s *topSource) latestPage(ctx context.Context, kind string, now time.Time) ([]corral.Event, error) {
	since := now.Add(-s.window)
	q := corral.AuditQuery{Team: s.team, Kind: kind, Limit: topAuditPage, Since: since}
	evs, err := s.audit(ctx, q)
	if err != nil || len(evs) < topAuditPage {
		return evs, err
	}
	lo, hi := since, now // a page from lo is full; from hi (now) it is not
	var best []corral.Event
	for i := 0; i < topBisect && hi.Sub(lo) > time.Second; i++ {
		mid := lo.Add(hi.Sub(lo) / 2)
		q.Since = mid
		page, err := s.audit(ctx, q)
		if err != nil {
			return nil, err
		}
		if len(page) == topAuditPage {
			lo = mid
		} else {
			hi, best = mid, page
		}
	}
	if best == nil {
		q.Since = hi
		return s.audit(ctx, q)
	}
	return best, nil
}

// incidentOf returns the incident an audit event is, if it is one:
// every breaker trip, cpu_runaway and OOM kill, refused egress attempts
// (allowed ones are not) and egress summaries (refusals only counted).
func incidentOf(ev *corral.Event) (topIncident, bool) {
	in := topIncident{ID: ev.ID, Time: ev.Time, Kind: ev.Kind, Sandbox: ev.Sandbox, Task: ev.Task}
	var d struct {
		Code, Budget, Reason, Message string
		Host, Verdict, Mode           string
		Port                          int
		Suppressed                    int64
		Value, Limit                  float64
	}
	_ = json.Unmarshal(ev.Data, &d)
	switch {
	case ev.Kind == "task.breaker_open":
		in.Detail = strings.TrimSpace(d.Code + " " + d.Budget + ": " + d.Reason)
	case ev.Kind == "watchdog.cpu_runaway" || ev.Kind == "watchdog.oom":
		in.Detail = d.Message
	case ev.Kind == "egress.summary":
		in.Detail = fmt.Sprintf("%d more refusals counted", d.Suppressed)
	case strings.HasPrefix(ev.Kind, "egress.") && d.Verdict == "refused":
		target := d.Host
		if d.Port != 0 {
			target = fmt.Sprintf("%s:%d", d.Host, d.Port)
		}
		in.Detail = "refused " + target + ": " + d.Reason
	default:
		return in, false
	}
	return in, true
}

// runTopTTY runs the interactive screen: raw mode and the alternate
// screen while it runs, restored on every way out (q, Ctrl-C, SIGTERM,
// SIGHUP, an error, a panic).
func runTopTTY(ctx context.Context, src *topSource, v topView, inFd, outFd int) (err error) {
	old, err := term.MakeRaw(inFd)
	if err != nil {
		return fmt.Errorf("terminal raw mode: %w", err)
	}
	out := os.Stdout
	io.WriteString(out, "\x1b[?1049h\x1b[?25l") // alternate screen, cursor hidden
	defer func() {
		io.WriteString(out, "\x1b[?25h\x1b[?1049l")
		if rerr := term.Restore(inFd, old); rerr != nil && err == nil {
			err = fmt.Errorf("restore the terminal: %w", rerr)
		}
	}()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGWINCH, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT)
	defer signal.Stop(sigs)

	keys := make(chan []byte)
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := os.Stdin.Read(buf)
			if err != nil {
				close(keys)
				return
			}
			keys <- bytes.Clone(buf[:n])
		}
	}()

	type result struct {
		v   topView
		err error
	}
	results := make(chan result, 1)
	fetch := func() {
		nv := topView{}
		var ferr error
		defer func() {
			// A panic here would end the process without the deferred
			// restore of the terminal: report it as an error instead.
			if p := recover(); p != nil {
				ferr = fmt.Errorf("refresh: %v", p)
			}
			results <- result{nv, ferr}
		}()
		ferr = src.refresh(ctx, &nv)
	}
	go fetch()
	ticker := time.NewTicker(v.Interval)
	defer ticker.Stop()
	fetching := true

	draw := func() {
		w, h, serr := term.GetSize(outFd)
		if serr != nil || w <= 0 || h <= 0 {
			w, h = 80, 24
		}
		lines, header := renderTop(&v, topLayout{Width: w - 1, Height: h})
		var b strings.Builder
		b.WriteString("\x1b[H")
		for i, l := range lines {
			if i > 0 {
				b.WriteString("\r\n")
			}
			if i == header {
				b.WriteString("\x1b[7m" + l + "\x1b[0m")
			} else {
				b.WriteString(l)
			}
			b.WriteString("\x1b[K")
		}
		b.WriteString("\x1b[J")
		io.WriteString(out, b.String())
	}
	if v.Now.IsZero() {
		v.Now = time.Now()
	}
	draw()
	for {
		select {
		case <-ctx.Done():
			return nil
		case sig := <-sigs:
			if sig != syscall.SIGWINCH {
				return nil
			}
		case <-ticker.C:
			if !fetching {
				fetching = true
				go fetch()
			}
			continue
		case r := <-results:
			fetching = false
			if r.err != nil {
				v.Err, v.Now = r.err.Error(), time.Now()
			} else {
				v.Err, v.Now, v.Rows, v.Tripped, v.Incidents = "", r.v.Now, r.v.Rows, r.v.Tripped, r.v.Incidents
			}
		case k, ok := <-keys:
			if !ok || topKey(&v, k) {
				return nil
			}
		}
		draw()
	}
}

// topKey applies one read of keyboard input to v and reports whether
// corral top should quit. An escape sequence (an arrow key, a function
// key) arrives as one read starting with ESC and is ignored.
func topKey(v *topView, k []byte) (quit bool) {
	if len(k) > 1 && k[0] == 0x1b {
		return false
	}
	for _, c := range k {
		if v.Editing {
			switch {
			case c == '\r' || c == '\n':
				v.Editing, v.Filter = false, v.Input
			case c == 0x1b:
				v.Editing = false
			case c == 0x7f || c == 0x08:
				if r := []rune(v.Input); len(r) > 0 {
					v.Input = string(r[:len(r)-1])
				}
			case c == 0x03:
				return true
			case c >= 0x20 && len(v.Input) < topMaxFilter:
				v.Input += string(c)
			}
			continue
		}
		switch c {
		case 'q', 0x03, 0x04:
			return true
		case 'c':
			v.Sort = "cpu"
		case 'm':
			v.Sort = "mem"
		case 'a':
			v.Sort = "age"
		case '/':
			v.Editing, v.Input = true, v.Filter
		case 0x1b:
			v.Filter = ""
		}
	}
	return false
}
