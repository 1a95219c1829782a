package egress

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Defaults of the [Summarizer].
const (
	// DefaultSummaryInterval is the window over which a sandbox's refusals
	// are counted.
	DefaultSummaryInterval = time.Minute
	// DefaultSummaryAfter is how many refusals of one sandbox in one
	// window are recorded one by one before the rest are only counted.
	DefaultSummaryAfter = 60
	// SummaryTopN is the most names and reasons a [Summary] lists.
	SummaryTopN = 10
	// summaryTracked is how many distinct names (and reasons) a window
	// counts exactly; past it the counts are those of the space-saving
	// algorithm (the heaviest names stay, each count is at most
	// overestimated by the smallest tracked count).
	summaryTracked = 64
)

// SummaryConfig configures a [Summarizer].
type SummaryConfig struct {
	// Interval is the length of a sandbox's window (default
	// [DefaultSummaryInterval]).
	Interval time.Duration
	// After is how many refusals per sandbox and window are recorded one
	// by one (default [DefaultSummaryAfter]; negative: none).
	After int
	// OnSummary receives one [Summary] per sandbox and window in which
	// refusals were only counted. It is called from a timer's goroutine,
	// never with a lock held.
	OnSummary func(Summary)
	// Log receives one line per summary. Nil discards.
	Log *slog.Logger
}

// Summary is what a [Summarizer] counted of one sandbox's refusals in one
// window instead of recording them one by one.
type Summary struct {
	// Sandbox is the sandbox that was refused ("" for unknown clients).
	Sandbox string
	// Start and End bound the window.
	Start, End time.Time
	// Recorded is how many refusals of the window were recorded one by
	// one (before the rest were counted here).
	Recorded int
	// Suppressed is how many refusals were counted here only.
	Suppressed int
	// ByMode counts the suppressed refusals by [Event.Mode] (dns,
	// explicit, transparent, raw).
	ByMode map[string]int
	// TopNames are the most refused names (the query name, host or
	// address), highest count first, at most [SummaryTopN].
	TopNames []Count
	// TopReasons are the most frequent refusal reasons, likewise.
	TopReasons []Count
}

// Count is one entry of a [Summary]'s top lists.
type Count struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// Summarizer bounds the events a flood of refusals makes (issue 10 item
// 4: every refused DNS query and every cap refusal was its own audit event
// and log line, so one sandbox looping over refused names filled the
// audit log and the queue every sandbox's events share). Per sandbox and
// window of [SummaryConfig.Interval], the first [SummaryConfig.After]
// refusals are recorded one by one; the rest are counted and one
// [Summary] (counts, top names, top reasons) is emitted when the window
// ends. Allowed attempts are always recorded: they are bounded by the
// DNS rate limit and the proxy's caps, and each is evidence of what left
// the host. A Summarizer is shared by the proxy and the DNS filter; a nil
// *Summarizer records everything. It is safe for concurrent use.
type Summarizer struct {
	cfg SummaryConfig
	log *slog.Logger
	now func() time.Time
	// afterFunc starts a window's timer (time.AfterFunc; tests replace it
	// to end windows without waiting for the clock).
	afterFunc func(d time.Duration, f func()) (stop func() bool)

	// mu guards windows and closed.
	mu      sync.Mutex
	windows map[string]*window
	closed  bool
}

// window is one sandbox's current window; guarded by Summarizer.mu.
type window struct {
	start      time.Time
	recorded   int
	suppressed int
	byMode     map[string]int
	names      topCounter
	reasons    topCounter
	stopTimer  func() bool
}

// NewSummarizer returns a summarizer with cfg.
func NewSummarizer(cfg SummaryConfig) *Summarizer {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultSummaryInterval
	}
	if cfg.After == 0 {
		cfg.After = DefaultSummaryAfter
	}
	s := &Summarizer{cfg: cfg, log: cfg.Log, now: time.Now, windows: map[string]*window{},
		afterFunc: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// admit reports whether ev is to be logged and recorded one by one; when
// it is not, it has been counted in its sandbox's window.
func (s *Summarizer) admit(ev Event) bool {
	if s == nil || ev.Verdict == VerdictAllowed {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return true
	}
	w := s.windows[ev.Sandbox]
	if w == nil {
		w = &window{start: s.now(), byMode: map[string]int{}}
		s.windows[ev.Sandbox] = w
		id := ev.Sandbox
		w.stopTimer = s.afterFunc(s.cfg.Interval, func() { s.flush(id, w) })
	}
	if w.recorded < s.cfg.After {
		w.recorded++
		return true
	}
	w.suppressed++
	w.byMode[ev.Mode]++
	w.names.add(ev.Host)
	w.reasons.add(ev.Reason)
	return false
}

// flush ends sandbox id's window w (if it is still current) and emits its
// summary when it counted anything.
func (s *Summarizer) flush(id string, w *window) {
	s.mu.Lock()
	if s.windows[id] != w {
		s.mu.Unlock()
		return
	}
	delete(s.windows, id)
	w.stopTimer()
	s.mu.Unlock()
	s.emit(id, w)
}

func (s *Summarizer) emit(id string, w *window) {
	if w.suppressed == 0 {
		return
	}
	sum := Summary{Sandbox: id, Start: w.start, End: s.now(), Recorded: w.recorded, Suppressed: w.suppressed,
		ByMode: w.byMode, TopNames: w.names.top(SummaryTopN), TopReasons: w.reasons.top(SummaryTopN)}
	top := ""
	if len(sum.TopNames) > 0 {
		top = sum.TopNames[0].Name
	}
	s.log.Warn("egress refusals summarised", "sandbox", id, "recorded", sum.Recorded, "suppressed", sum.Suppressed, "top_name", top)
	if s.cfg.OnSummary != nil {
		s.cfg.OnSummary(sum)
	}
}

// Forget ends sandbox id's window now (call it when the sandbox's network
// is removed), emitting its summary.
func (s *Summarizer) Forget(id string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	w := s.windows[id]
	s.mu.Unlock()
	if w != nil {
		s.flush(id, w)
	}
}

// Close ends every window, emitting their summaries; later refusals are
// recorded one by one.
func (s *Summarizer) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	ws := s.windows
	s.windows = map[string]*window{}
	s.mu.Unlock()
	ids := make([]string, 0, len(ws))
	for id := range ws {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ws[id].stopTimer()
		s.emit(id, ws[id])
	}
}

// topCounter counts keys in at most summaryTracked counters (the
// space-saving algorithm), so that a flood of distinct names takes
// constant memory.
type topCounter struct {
	n map[string]int
}

func (t *topCounter) add(key string) {
	if t.n == nil {
		t.n = map[string]int{}
	}
	if _, ok := t.n[key]; ok || len(t.n) < summaryTracked {
		t.n[key]++
		return
	}
	minKey, minN, first := "", 0, true
	for k, n := range t.n {
		if first || n < minN || (n == minN && k < minKey) {
			minKey, minN, first = k, n, false
		}
	}
	delete(t.n, minKey)
	t.n[key] = minN + 1
}

// top returns the k largest counts, highest first (ties by name).
func (t *topCounter) top(k int) []Count {
	out := make([]Count, 0, len(t.n))
	for name, n := range t.n {
		out = append(out, Count{Name: name, Count: n})
	}
	slices.SortFunc(out, func(a, b Count) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out[:min(k, len(out))]
}
