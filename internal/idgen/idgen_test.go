package idgen

import (
	"regexp"
	"testing"
)

// TestFormats pins the shapes clients check (E2B SDKs match sandbox ids,
// the CLI and tests match snapshot, volume and task prefixes): a changed
// length or alphabet would break them.
func TestFormats(t *testing.T) {
	for _, c := range []struct {
		name string
		got  func() string
		re   string
	}{
		{"sandbox", func() string { return New("", SandboxLen) }, `^[a-z0-9]{20}$`},
		{"snapshot", func() string { return New("snap-", SandboxLen) }, `^snap-[a-z0-9]{20}$`},
		{"volume", func() string { return New("vol", 17) }, `^vol[a-z0-9]{17}$`},
		{"task", func() string { return New("t", 19) }, `^t[a-z0-9]{19}$`},
		{"token", Token, `^[0-9a-f]{48}$`},
		{"api key", func() string { return "e2b_" + Hex(20) }, `^e2b_[0-9a-f]{40}$`},
	} {
		re := regexp.MustCompile(c.re)
		seen := map[string]bool{}
		for range 200 {
			v := c.got()
			if !re.MatchString(v) {
				t.Fatalf("%s: %q does not match %s", c.name, v, c.re)
			}
			if seen[v] {
				t.Fatalf("%s: %q drawn twice", c.name, v)
			}
			seen[v] = true
		}
	}
}

// TestNewUniform defends against a biased id (the old generator took
// byte%36, so a-d came up 8/7 as often as the rest): over many draws each
// character's count stays near the mean.
func TestNewUniform(t *testing.T) {
	const draws = 36 * 20000
	counts := map[byte]int{}
	s := New("", draws)
	for i := range len(s) {
		counts[s[i]]++
	}
	if len(counts) != len(Alphabet) {
		t.Fatalf("saw %d distinct characters, want %d", len(counts), len(Alphabet))
	}
	mean := draws / len(Alphabet)
	for c, n := range counts {
		// The old bias put a-d at +12.5% of the mean; chance alone stays
		// within ±6% (≈ 8.6 standard deviations) here.
		if n < mean*94/100 || n > mean*106/100 {
			t.Errorf("character %q drawn %d times, mean %d", c, n, mean)
		}
	}
}
