package template

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func TestParseProgressLine(t *testing.T) {
	tests := []struct {
		line string
		want progressEvent
		ok   bool
	}{
		{"I: Retrieving adduser 3.134", progressEvent{"Retrieving", "adduser"}, true},
		{"I: Validating bsdutils 1:2.38.1-5+deb12u3", progressEvent{"Validating", "bsdutils"}, true},
		{"I: Retrieving libstdc++6 12.2.0-14+deb12u1", progressEvent{"Retrieving", "libstdc++6"}, true},
		{"I: Extracting libapt-pkg6.0...", progressEvent{"Extracting", "libapt-pkg6.0"}, true},
		{"I: Unpacking gcc-12-base:amd64...", progressEvent{"Unpacking", "gcc-12-base"}, true},
		{"I: Unpacking python3...", progressEvent{"Unpacking", "python3"}, true},
		{"I: Configuring libc-bin...\r\n", progressEvent{"Configuring", "libc-bin"}, true},
		{"I: Configuring python-is-python3...", progressEvent{"Configuring", "python-is-python3"}, true},
		{"I: Retrieving InRelease ", progressEvent{}, false},
		{"I: Retrieving Packages ", progressEvent{}, false},
		{"I: Validating Packages ", progressEvent{}, false},
		{"I: Unpacking required packages...", progressEvent{}, false},
		{"I: Unpacking the base system...", progressEvent{}, false},
		{"I: Configuring required packages...", progressEvent{}, false},
		{"I: Resolving dependencies of base packages...", progressEvent{}, false},
		{"I: Base system installed successfully.", progressEvent{}, false},
		{"E: Failed getting release file http://x/dists/bookworm/Release", progressEvent{}, false},
		{"W: Retrieving foo 1.0", progressEvent{}, false},
		{"", progressEvent{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			got, ok := parseProgressLine(tt.line)
			if ok != tt.ok || got != tt.want {
				t.Errorf("parseProgressLine(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestProgressRecorded replays the output of a real debootstrap run of the
// base template (testdata/debootstrap-bookworm.log) through the plain-text
// progress display.
func TestProgressRecorded(t *testing.T) {
	data, err := os.ReadFile("testdata/debootstrap-bookworm.log")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p := newProgress(&out, "base")
	if p.bar != nil {
		t.Fatal("progress bar used for a non-terminal writer")
	}
	for _, l := range strings.Split(string(data), "\n") {
		p.line(l)
	}
	p.done("built")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")

	counts := map[string]int{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 4 {
			counts[f[2]]++
		}
	}
	wantCounts := map[string]int{"Retrieving": 142, "Extracting": 88, "Unpacking": 137, "Configuring": 140}
	for phase, n := range wantCounts {
		if counts[phase] != n {
			t.Errorf("%d %s lines, want %d", counts[phase], phase, n)
		}
	}
	if counts["Validating"] != 0 {
		t.Errorf("Validating steps shown: %d", counts["Validating"])
	}

	must := []string{
		"[base] 1/142 Retrieving adduser",
		"[base] 142/142 Retrieving zlib1g",
		"[base] 1/142 Extracting adduser",
		"[base] 30/142 Unpacking libc6",
		"[base] 140/142 Configuring ca-certificates",
	}
	for _, m := range must {
		if !strings.Contains(out.String(), m+"\n") {
			t.Errorf("output lacks %q", m)
		}
	}
	if last := lines[len(lines)-1]; last != "[base] built" {
		t.Errorf("last line %q", last)
	}
}

// TestProgressGrowsTotal checks that a run with more packages than estimated
// never shows a count above the total.
func TestProgressGrowsTotal(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, "base")
	for i := 0; i < estimatedPackages+5; i++ {
		p.event(progressEvent{Phase: phaseRetrieving, Package: "p"})
	}
	p.event(progressEvent{Phase: phaseUnpacking, Package: "p"})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if want := "[base] 147/147 Retrieving p"; lines[len(lines)-2] != want {
		t.Errorf("got %q, want %q", lines[len(lines)-2], want)
	}
	if want := "[base] 1/147 Unpacking p"; lines[len(lines)-1] != want {
		t.Errorf("got %q, want %q", lines[len(lines)-1], want)
	}
}

func TestProgressNilWriter(t *testing.T) {
	p := newProgress(nil, "base")
	p.line("I: Retrieving adduser 3.134")
	p.step("x")
	p.done("y")
	p.fail(os.ErrClosed)
}

// TestProgressApt checks the display of the apt-get step after
// debootstrap: its count of new packages becomes the total, its Get,
// Unpacking and Setting up lines are steps under the build's name, and
// other lines (index downloads, triggers) are not.
func TestProgressApt(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, "code-interpreter")
	for _, l := range []string{
		"Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]",
		"Get:2 http://deb.debian.org/debian bookworm/main amd64 Packages [8787 kB]",
		"0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.",
		"Get:3 http://deb.debian.org/debian bookworm/main amd64 python3-zmq amd64 24.0.1-4+b1 [259 kB]",
		"Get:4 http://deb.debian.org/debian bookworm/main amd64 libzmq5 amd64 4.3.4-6 [273 kB]",
		"Unpacking python3-zmq (24.0.1-4+b1) ...",
		"Setting up python3-zmq (24.0.1-4+b1) ...",
		"Setting up libzmq5:amd64 (4.3.4-6) ...",
		"Processing triggers for libc-bin (2.36-9+deb12u4) ...",
	} {
		p.aptLine(l)
	}
	want := "[code-interpreter] 1/2 Retrieving python3-zmq\n[code-interpreter] 2/2 Retrieving libzmq5\n" +
		"[code-interpreter] 1/2 Unpacking python3-zmq\n" +
		"[code-interpreter] 1/2 Configuring python3-zmq\n[code-interpreter] 2/2 Configuring libzmq5\n"
	if out.String() != want {
		t.Errorf("display:\n%s\nwant:\n%s", out.String(), want)
	}
}
