package govern

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Loop detection defaults and ceilings; see [LoopConfig].
const (
	// DefaultLoopWindow is the default number of recent calls judged.
	DefaultLoopWindow = 10
	// DefaultLoopSimilarity is the default similarity at or above which two
	// calls count as the same call.
	DefaultLoopSimilarity = 0.85
	// DefaultLoopWarnAt is the default number of same-ish calls (the latest
	// included) that gives a loop_suspected warning.
	DefaultLoopWarnAt = 4
	// DefaultLoopTripAt is the default score that gives loop_detected.
	DefaultLoopTripAt = 8.0
	// MaxLoopWindow is the largest window a [LoopDetector] keeps; larger
	// configured windows are clamped to it, so that one Observe costs at
	// most MaxLoopWindow comparisons.
	MaxLoopWindow = 100
	// MaxLoopCommandLen is how many bytes of a command the detector reads:
	// [Normalize] and [Similarity] ignore the rest, so a huge command cannot
	// make them slow.
	MaxLoopCommandLen = 2048
)

// Call is one tool call of a task as the loop detector sees it.
type Call struct {
	Command  string // command text (argv joined with spaces, or the shell string)
	ExitCode int    // -1 when unknown / still running
	Failed   bool   // ended with non-zero exit, timeout or kill
}

// failed reports whether the call is known to have failed. A positive exit
// code counts as a failure even if Failed was not set.
func (c Call) failed() bool { return c.Failed || c.ExitCode > 0 }

// known reports whether the call's outcome is known.
func (c Call) known() bool { return c.failed() || c.ExitCode == 0 }

// LoopConfig sets the thresholds of a [LoopDetector]. Zero (or negative)
// fields take the defaults.
type LoopConfig struct {
	Window     int     // last N calls considered; default 10, at most MaxLoopWindow
	Similarity float64 // two calls are "the same" when similarity >= this; default 0.85
	WarnAt     int     // same-ish calls within the window that give a loop_suspected warning; default 4
	TripAt     float64 // weighted score that opens the breaker (loop_detected); default 8
}

func (c LoopConfig) withDefaults() LoopConfig {
	if c.Window <= 0 {
		c.Window = DefaultLoopWindow
	}
	c.Window = min(c.Window, MaxLoopWindow)
	if !(c.Similarity > 0) {
		c.Similarity = DefaultLoopSimilarity
	}
	c.Similarity = min(c.Similarity, 1)
	if c.WarnAt <= 0 {
		c.WarnAt = DefaultLoopWarnAt
	}
	if !(c.TripAt > 0) {
		c.TripAt = DefaultLoopTripAt
	}
	return c
}

// LoopVerdict is the judgement of a [LoopDetector] after one call.
type LoopVerdict struct {
	Suspected bool    // warn: "loop_suspected"
	Detected  bool    // trip: "loop_detected"
	Repeats   int     // how many calls in the window are near-identical to the latest
	Score     float64 // weighted score
	Reason    string  // short human text, e.g. `9 of the last 10 calls repeat "curl https://api..." (7 failing with exit 22)`
}

// Code returns the event and error code of the verdict: "loop_detected",
// "loop_suspected", or "" when the calls look fine.
func (v LoopVerdict) Code() string {
	switch {
	case v.Detected:
		return "loop_detected"
	case v.Suspected:
		return "loop_suspected"
	}
	return ""
}

// LoopDetector watches the tool calls of one task and tells when the agent
// is going round in circles. It is safe for concurrent use.
//
// Each [LoopDetector.Observe] judges the latest call against the earlier
// calls of the window (the last Window calls):
//
//   - two calls are near-identical when their [Similarity] is at least the
//     configured Similarity. The calls that repeat the latest are those
//     linked to it by a chain of near-identical calls within the window, so
//     a search reworded a little each time stays one loop even when its
//     first and latest wordings have drifted apart;
//   - each repeat scores 1, or 2 when both it and the latest call failed
//     with the same exit code (a retry that keeps failing the same way is
//     the surest sign of a loop). While the latest call is still running
//     (ExitCode -1), the outcome of the most recent finished repeat stands
//     in for it;
//   - calls before the most recent progress do not count. Progress is a
//     call that did not fail, is unlike every other call of the window and
//     runs another program (first word) than the latest call: the agent
//     did something new, such as editing a file. So an edit-test cycle
//     (`sed -i ...` of different lines, then `pytest -q`, again and again)
//     never warns, whether the tests pass or fail, while the same command
//     run time after time with nothing new in between warns and then
//     trips, even if it succeeds every time. A reworded search is no
//     progress even when it resembles no other call: it runs the same
//     program.
//
// Repeats is the number of repeats found (the latest call not included);
// the verdict is Suspected when Repeats+1 >= WarnAt and Detected when
// Score >= TripAt (Detected implies Suspected). With the defaults (window
// 10, warn at 4, trip at 8) a command failing the same way warns on its
// fourth run and trips on its fifth; one that succeeds (or an endless
// search with small variations) warns on its fourth and trips on its ninth
// within ten calls.
//
// Known limits: a cycle of two different commands that both succeed fills
// at most half the window, so it warns but does not trip (failing the same
// way, it trips); and an agent that does something new every few calls is
// not detected. The task's call and duration budgets bound both.
//
// The cost of one Observe is at most Window similarity computations on
// commands of at most MaxLoopCommandLen bytes, plus O(Window²) integer work.
type LoopDetector struct {
	cfg LoopConfig

	mu      sync.Mutex
	window  []*loopEntry // oldest first; seqs are consecutive
	nextSeq uint64
}

// loopEntry is a call in the window with what the detector derived from it.
type loopEntry struct {
	call  Call
	seq   uint64
	grams []uint32 // sorted trigram multiset of the normalised command
	prog  string   // first word of the normalised command
	// nearer lists the seqs of later calls in the window that are
	// near-identical to this one; nearCount counts all near-identical
	// calls in the window, earlier and later.
	nearer    []uint64
	nearCount int
}

// progressFor reports whether the entry is evidence of new work done since
// the earlier calls like latest: it did not fail, no other call in the
// window resembles it, and it runs another program than latest.
func (e *loopEntry) progressFor(latest *loopEntry) bool {
	return !e.call.failed() && e.nearCount == 0 && e.prog != latest.prog
}

// NewLoopDetector returns a detector with the given thresholds; zero fields
// take the defaults.
func NewLoopDetector(cfg LoopConfig) *LoopDetector {
	cfg = cfg.withDefaults()
	return &LoopDetector{cfg: cfg, window: make([]*loopEntry, 0, cfg.Window)}
}

// Observe adds a call (finished, or just started with ExitCode -1) to the
// window and judges the window with it as the latest call.
func (d *LoopDetector) Observe(c Call) LoopVerdict {
	norm := Normalize(c.Command)
	prog, _, _ := strings.Cut(norm, " ")
	e := &loopEntry{call: c, grams: trigrams(norm), prog: prog}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.window) == d.cfg.Window {
		d.evictOldest()
	}
	e.seq = d.nextSeq
	d.nextSeq++
	for _, o := range d.window {
		if dice(e.grams, o.grams) >= d.cfg.Similarity {
			o.nearer = append(o.nearer, e.seq)
			o.nearCount++
			e.nearCount++
		}
	}
	d.window = append(d.window, e)
	return d.judge()
}

// evictOldest drops the oldest call and forgets its resemblances.
func (d *LoopDetector) evictOldest() {
	old := d.window[0]
	d.window = slices.Delete(d.window, 0, 1)
	for _, s := range old.nearer {
		// Later calls are still in the window, at index s - first seq.
		d.window[s-old.seq-1].nearCount--
	}
}

// judge scores the latest call of the window.
func (d *LoopDetector) judge() LoopVerdict {
	n := len(d.window)
	latest := d.window[n-1]
	base := d.window[0].seq
	// Calls before the most recent progress do not count.
	from := 0
	for i := n - 2; i >= 0; i-- {
		if d.window[i].progressFor(latest) {
			from = i + 1
			break
		}
	}
	// The loop is every call from there on linked to the latest by a
	// chain of near-identical calls.
	adj := make([][]int, n)
	for i := from; i < n; i++ {
		for _, s := range d.window[i].nearer {
			j := int(s - base)
			adj[i] = append(adj[i], j)
			adj[j] = append(adj[j], i)
		}
	}
	in := make([]bool, n)
	in[n-1] = true
	for stack := []int{n - 1}; len(stack) > 0; {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, j := range adj[i] {
			if !in[j] {
				in[j] = true
				stack = append(stack, j)
			}
		}
	}

	ref, refKnown := latest.call, latest.call.known()
	repeats, failing := 0, 0
	if ref.failed() {
		failing = 1
	}
	score := 0.0
	for i := n - 2; i >= from; i-- {
		o := d.window[i]
		if !in[i] {
			continue
		}
		if !refKnown && o.call.known() {
			ref, refKnown = o.call, true
		}
		repeats++
		w := 1.0
		if refKnown && ref.failed() && o.call.failed() && o.call.ExitCode == ref.ExitCode {
			w = 2
			failing++
		}
		score += w
	}
	v := LoopVerdict{Repeats: repeats, Score: score}
	v.Detected = score >= d.cfg.TripAt
	v.Suspected = v.Detected || repeats+1 >= d.cfg.WarnAt
	if v.Suspected {
		v.Reason = fmt.Sprintf("%d of the last %d calls repeat %q", repeats+1, len(d.window), clipCommand(latest.call.Command))
		if failing > 0 && ref.failed() {
			if ref.ExitCode >= 0 {
				v.Reason += fmt.Sprintf(" (%d failing with exit %d)", failing, ref.ExitCode)
			} else {
				v.Reason += fmt.Sprintf(" (%d failing the same way)", failing)
			}
		}
	}
	return v
}

// Finish records the outcome of a call observed while it was still running
// (ExitCode -1): the most recent such call with exactly c.Command takes
// c.ExitCode and c.Failed. It reports whether it found one. The next
// [LoopDetector.Observe] judges with the new outcome.
func (d *LoopDetector) Finish(c Call) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.window) - 1; i >= 0; i-- {
		e := d.window[i]
		if e.call.Command == c.Command && !e.call.known() {
			e.call.ExitCode, e.call.Failed = c.ExitCode, c.Failed
			return true
		}
	}
	return false
}

// Reset forgets every call, as after an operator resets the task's breaker.
func (d *LoopDetector) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.window)
	d.window = d.window[:0]
}

// clipCommand shortens a command for a human reason text.
func clipCommand(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const limit = 40
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	r := []rune(s)
	return string(r[:limit]) + "..."
}

// Placeholders [Normalize] puts in place of variable parts.
var (
	reUUID   = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	reDate   = regexp.MustCompile(`(?i)\b\d{4}-\d{2}-\d{2}(?:[t ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:z|[+-]\d{2}(?::?\d{2})?)?)?`)
	reTime   = regexp.MustCompile(`\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b`)
	reHex0x  = regexp.MustCompile(`(?i)\b0x[0-9a-f]+\b`)
	reHex    = regexp.MustCompile(`(?i)\b[0-9a-f]{8,}\b`)
	reToken  = regexp.MustCompile(`[A-Za-z0-9_-]{16,}`)
	reNumber = regexp.MustCompile(`\d+(?:\.\d+)*`)
)

// Normalize returns the canonical form of a command that [Similarity]
// compares: only the first MaxLoopCommandLen bytes are read; UUIDs become
// <uuid>, ISO dates and times <ts>, hex strings of 8 or more characters
// with a digit (and 0x literals) <hex>, long random-looking tokens <rand>,
// and the remaining numbers, decimals and dotted versions included, <n>;
// then the text is lower-cased, double quotes become single quotes, runs of
// white space become one space, and white space just inside quotes and at
// both ends is dropped. So `curl "https://x/q?page=2"` and
// `curl  'https://X/q?page=10'` normalise alike.
//
// A random-looking token is a run of 16 or more letters, digits, '_' and
// '-' with at least one letter and one digit that has three or more runs of
// digits, or two runs of digits and mixed case, or is 32 or more long:
// session ids, API keys and temporary names, not words like
// "python3-asyncio" or "x86_64-linux-gnu".
func Normalize(cmd string) string {
	if len(cmd) > MaxLoopCommandLen {
		cut := MaxLoopCommandLen
		for cut > 0 && !utf8.RuneStart(cmd[cut]) {
			cut--
		}
		cmd = cmd[:cut]
	}
	s := reUUID.ReplaceAllString(cmd, "<uuid>")
	s = reDate.ReplaceAllString(s, "<ts>")
	s = reTime.ReplaceAllString(s, "<ts>")
	s = reHex0x.ReplaceAllString(s, "<hex>")
	s = reHex.ReplaceAllStringFunc(s, func(h string) string {
		if strings.ContainsAny(h, "0123456789") && strings.ContainsAny(h, "abcdefABCDEF") {
			return "<hex>"
		}
		return h
	})
	s = reToken.ReplaceAllStringFunc(s, func(t string) string {
		if randomToken(t) {
			return "<rand>"
		}
		return t
	})
	s = reNumber.ReplaceAllString(s, "<n>")
	return squeezeSpace(strings.ToLower(s))
}

// randomToken applies the shape test of [Normalize] to a run of
// [A-Za-z0-9_-] of 16 or more characters.
func randomToken(t string) bool {
	var upper, lower, digits, digitRuns int
	prevDigit := false
	for i := 0; i < len(t); i++ {
		c := t[i]
		isDigit := c >= '0' && c <= '9'
		switch {
		case isDigit:
			digits++
			if !prevDigit {
				digitRuns++
			}
		case c >= 'a' && c <= 'z':
			lower++
		case c >= 'A' && c <= 'Z':
			upper++
		}
		prevDigit = isDigit
	}
	if digits == 0 || upper+lower == 0 {
		return false
	}
	return digitRuns >= 3 || digitRuns >= 2 && upper > 0 && lower > 0 || len(t) >= 32
}

// squeezeSpace collapses white space, drops it at both ends and just inside
// quotes, and turns double quotes into single quotes. It follows shell
// quoting: no escapes inside single quotes, backslash escapes elsewhere.
func squeezeSpace(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	var quote rune   // 0 outside quotes, else the opening quote
	pending := false // white space seen and not yet written
	atStart := true  // nothing written since the start or an opening quote
	escaped := false // previous rune was an unquoted or "-quoted backslash
	for _, r := range s {
		if unicode.IsSpace(r) && !escaped {
			pending = true
			continue
		}
		closing := !escaped && quote != 0 && r == quote
		if pending && !atStart && !closing {
			b.WriteByte(' ')
		}
		pending = false
		atStart = false
		switch {
		case escaped:
			escaped = false
		case r == '\\' && quote != '\'':
			escaped = true
		case closing:
			quote = 0
		case quote == 0 && (r == '\'' || r == '"'):
			quote = r
			atStart = true
		}
		if r == '"' {
			r = '\''
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Similarity returns how alike two commands are, from 0 (nothing in common)
// to 1 (the same after [Normalize]).
//
// It is the Sørensen-Dice coefficient of the multisets of byte 3-grams of
// the normalised commands, each padded with a space at both ends:
// 2·|A∩B| / (|A|+|B|). Every small edit (a changed word or argument, an
// added flag) changes only the few 3-grams around it, so two long commands
// that differ by one word stay above 0.85 while short unrelated commands
// share almost nothing; word order matters only at the seams. Each
// command is cut at MaxLoopCommandLen bytes before normalising, so the cost
// is O(n log n) in that bounded length.
func Similarity(a, b string) float64 {
	na, nb := Normalize(a), Normalize(b)
	if na == nb {
		return 1
	}
	return dice(trigrams(na), trigrams(nb))
}

// trigrams returns the sorted multiset of byte 3-grams of " "+s+" ".
func trigrams(s string) []uint32 {
	p := " " + s + " "
	if len(p) < 3 {
		return nil
	}
	g := make([]uint32, 0, len(p)-2)
	for i := 0; i+3 <= len(p); i++ {
		g = append(g, uint32(p[i])<<16|uint32(p[i+1])<<8|uint32(p[i+2]))
	}
	slices.Sort(g)
	return g
}

// dice returns the Dice coefficient of two sorted multisets; two empty
// multisets are identical.
func dice(a, b []uint32) float64 {
	if len(a)+len(b) == 0 {
		return 1
	}
	common := 0
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			common++
			i++
			j++
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return 2 * float64(common) / float64(len(a)+len(b))
}
