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
	w      io.Writer // nil: discard everything
	bar    *progressbar.ProgressBar
	total  int            // package count (estimated until retrieval is done)
	counts map[string]int // packages seen per phase
	phase  string         // current phase
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, total: estimatedPackages, counts: map[string]int{}}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(p.total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("[base] starting debootstrap"),
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
		p.bar.Describe(fmt.Sprintf("[base] %s %s", ev.Phase, ev.Package))
		_ = p.bar.Set(n)
		return
	}
	fmt.Fprintf(p.w, "[base] %d/%d %s %s\n", n, p.total, ev.Phase, ev.Package)
}

// step shows a build step that is not part of debootstrap.
func (p *progress) step(format string, args ...any) {
	if p.w == nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if p.bar != nil {
		p.bar.Describe("[base] " + msg)
		return
	}
	fmt.Fprintf(p.w, "[base] %s\n", msg)
}

// done ends the display with a final message.
func (p *progress) done(format string, args ...any) {
	if p.w == nil {
		return
	}
	if p.bar != nil {
		_ = p.bar.Finish()
	}
	fmt.Fprintf(p.w, "[base] "+format+"\n", args...)
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
	fmt.Fprintf(p.w, "[base] build failed: %v\n", err)
}
