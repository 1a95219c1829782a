package template

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Phases of a debootstrap run, as named in its "I: <Phase> <package>" lines.
const (
	phaseRetrieving  = "Retrieving"
	phaseValidating  = "Validating"
	phaseExtracting  = "Extracting"
	phaseUnpacking   = "Unpacking"
	phaseConfiguring = "Configuring"
)

// estimatedPackages is the package count assumed until debootstrap has
// retrieved every package: minbase plus the default base packages resolve
// to 142 packages on bookworm (see testdata/debootstrap-bookworm.log).
const estimatedPackages = 142

// progressLineRE matches debootstrap lines about one package:
//
//	I: Retrieving python3 3.11.2-1+b1
//	I: Unpacking libc6:amd64...
//
// A package name is lowercase and is followed by "..." or by a version, which
// starts with a digit, so lines such as "I: Retrieving Packages" and
// "I: Unpacking required packages..." do not match.
var progressLineRE = regexp.MustCompile(`^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) ([a-z0-9][a-z0-9+.-]*?)(?::[a-z0-9-]+)?(?:\.\.\.| [0-9]\S*)\s*$`)

// aptLineRE matches apt-get install lines about one package (the
// package steps after debootstrap):
//
//	Get:5 http://deb.debian.org/debian bookworm/main amd64 python3-zmq amd64 24.0.1-4+b1 [259 kB]
//	Unpacking python3-zmq (24.0.1-4+b1) ...
//	Setting up python3-zmq (24.0.1-4+b1) ...
var aptLineRE = regexp.MustCompile(`^(?:Get:\d+ \S+ \S+ \S+ ([a-z0-9][a-z0-9+.-]*) \S+ [0-9]\S* |(Unpacking|Setting up) ([a-z0-9][a-z0-9+.-]*?)(?::[a-z0-9-]+)? \()`)

// aptCountRE matches apt-get's count of the packages it will install.
var aptCountRE = regexp.MustCompile(`^\d+ upgraded, (\d+) newly installed`)

// progressEvent is one step of debootstrap parsed from its output.
type progressEvent struct {
	Phase   string // one of the phase* constants
	Package string // package name without architecture or version
}

// parseProgressLine parses one line of debootstrap output. ok is false for
// lines that are not about one package.
func parseProgressLine(line string) (ev progressEvent, ok bool) {
	m := progressLineRE.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
	if m == nil {
		return progressEvent{}, false
	}
	return progressEvent{Phase: m[1], Package: m[2]}, true
}

// progress shows the progress of a build on a writer: a progress bar on a
// terminal, plain lines otherwise. It is not safe for concurrent use.
type progress struct {
	label  string    // the build's name, shown on every line
	w      io.Writer // nil: discard everything
	bar    *progressbar.ProgressBar
	total  int            // package count (estimated until retrieval is done)
	counts map[string]int // packages seen per phase
	phase  string         // current phase
}

func newProgress(w io.Writer, label string) *progress {
	p := &progress{label: label, w: w, total: estimatedPackages, counts: map[string]int{}}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(p.total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("["+label+"] starting debootstrap"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionShowDescriptionAtLineEnd(),
			progressbar.OptionClearOnFinish(),
		)
	}
	return p
}

// line handles one line of debootstrap output.
func (p *progress) line(s string) {
	ev, ok := parseProgressLine(s)
	if !ok {
		return
	}
	p.event(ev)
}

// aptLine handles one line of apt-get install's output: its package
// steps advance the display as debootstrap's do.
func (p *progress) aptLine(s string) {
	if m := aptCountRE.FindStringSubmatch(s); m != nil {
		var n int
		fmt.Sscan(m[1], &n)
		p.counts, p.phase, p.total = map[string]int{}, "", max(n, 1)
		return
	}
	m := aptLineRE.FindStringSubmatch(s)
	switch {
	case m == nil:
	case m[1] != "":
		p.event(progressEvent{Phase: phaseRetrieving, Package: m[1]})
	case m[2] == "Unpacking":
		p.event(progressEvent{Phase: phaseUnpacking, Package: m[3]})
	default:
		p.event(progressEvent{Phase: phaseConfiguring, Package: m[3]})
	}
}

// event advances the display by one parsed step. Validating steps follow
// each Retrieving step and are not shown.
func (p *progress) event(ev progressEvent) {
	if ev.Phase == phaseValidating {
		return
	}
	if p.phase == phaseRetrieving && ev.Phase != phaseRetrieving && p.counts[phaseRetrieving] > 0 {
		// Retrieval is over: now the package count is known exactly.
		p.total = p.counts[phaseRetrieving]
	}
	p.phase = ev.Phase
	p.counts[ev.Phase]++
	n := p.counts[ev.Phase]
	if n > p.total {
		p.total = n
	}
	if p.w == nil {
		return
	}
	if p.bar != nil {
		// The bar stops rendering once it reaches its max: start it
		// afresh for each phase (and if an estimate was too low).
		if n == 1 || p.bar.IsFinished() {
			p.bar.Reset()
		}
		if p.bar.GetMax() != p.total {
			p.bar.ChangeMax(p.total)
		}
		p.bar.Describe(fmt.Sprintf("[%s] %s %s", p.label, ev.Phase, ev.Package))
		_ = p.bar.Set(n)
		return
	}
	fmt.Fprintf(p.w, "[%s] %d/%d %s %s\n", p.label, n, p.total, ev.Phase, ev.Package)
}

// step shows a build step that is not part of debootstrap.
func (p *progress) step(format string, args ...any) {
	if p.w == nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if p.bar != nil {
		p.bar.Describe("[" + p.label + "] " + msg)
		return
	}
	fmt.Fprintf(p.w, "[%s] %s\n", p.label, msg)
}

// done ends the display with a final message.
func (p *progress) done(format string, args ...any) {
	if p.w == nil {
		return
	}
	if p.bar != nil {
		_ = p.bar.Finish()
	}
	fmt.Fprintf(p.w, "["+p.label+"] "+format+"\n", args...)
}

// fail ends the display after a failed build.
func (p *progress) fail(err error) {
	if p.w == nil {
		return
	}
	if p.bar != nil {
		_ = p.bar.Exit()
		fmt.Fprintln(p.w)
	}
	fmt.Fprintf(p.w, "[%s] build failed: %v\n", p.label, err)
}
