package egress

import (
	"fmt"
	"math"
	"strings"
)

// Limits used by [ExfilSuspect].
const (
	// MaxQueryNameLen is the longest query name accepted (DNS allows 253).
	MaxQueryNameLen = 200
	// MaxQueryLabelLen is the longest label accepted (DNS allows 63).
	MaxQueryLabelLen = 40
	// MaxQueryLabels is the largest number of labels accepted.
	MaxQueryLabels = 8
	// entropyMinLen is the shortest label whose entropy or encoding is
	// judged; shorter labels carry too little to matter and their entropy
	// estimate is meaningless.
	entropyMinLen = 16
	// entropyLimit is the Shannon entropy, in bits per character, at or
	// above which a long label is taken for encoded data.
	entropyLimit = 3.5
	// encodedMinLen is the shortest label tested for hex/base32/base64 shape.
	encodedMinLen = 24
)

// ExfilSuspect reports whether a DNS query name looks like data smuggled out
// through DNS (threat-model.md #8), and why. The DNS filter refuses such names
// even if the policy would allow them (a "*.example.com" pattern otherwise
// lets arbitrary subdomain labels through). It flags:
//
//   - names longer than 200 characters, labels longer than 40 characters
//     and names of more than 8 labels (tunnels such as iodine and dnscat2
//     fill names to the protocol limits);
//   - labels of 24 or more characters that look hex-, base32- or
//     base64-encoded: all [0-9a-f]; all letters and digits with at least two
//     digits among them; or mixed-case letters with digits;
//   - labels of 16 to 23 characters with such a shape (hex with three or
//     more digits; scattered digits and few vowels; mixed case), and labels
//     of 16 or more characters whose Shannon entropy (ignoring '-' and case,
//     as DNS compares names) is at least 3.5 bits per character and that do
//     not read like words (see suspectLabel).
//
// These heuristics are a second line: the DNS filter resolves only allowed
// names, so smuggled labels reach an outside server only under a wildcard
// pattern whose zone the attacker controls. Per-sandbox rate limiting
// ([ratelimit.Keyed]) bounds what short labels can still carry.
//
// Ordinary names pass: files.pythonhosted.org, objects.githubusercontent.com,
// s3.us-east-1.amazonaws.com, d3e4f5g6h7.cloudfront.net. Some rare legitimate
// names with long random labels (e.g. 32-character Lambda function URL ids)
// are refused; allow those through an address rule instead.
func ExfilSuspect(name string) (bool, string) {
	n := strings.TrimSuffix(strings.TrimSpace(name), ".")
	if len(n) > MaxQueryNameLen {
		return true, fmt.Sprintf("name is %d characters long (limit %d)", len(n), MaxQueryNameLen)
	}
	labels := strings.Split(n, ".")
	if len(labels) > MaxQueryLabels {
		return true, fmt.Sprintf("name has %d labels (limit %d)", len(labels), MaxQueryLabels)
	}
	for _, l := range labels {
		if len(l) > MaxQueryLabelLen {
			return true, fmt.Sprintf("label %s is %d characters long (limit %d)", clip(l), len(l), MaxQueryLabelLen)
		}
		if bad, why := suspectLabel(l); bad {
			return true, fmt.Sprintf("label %s %s", clip(l), why)
		}
	}
	return false, ""
}

// labelStats are the character counts the heuristics use.
type labelStats struct {
	upper, lower, digits, hyphens int
	hexChars                      int // [0-9a-fA-F]
	vowels                        int // aeiou, either case
	digitRuns                     int // maximal runs of digits
	caseSwitches                  int // lower-case letter followed by upper-case
}

func statsOf(l string) labelStats {
	var st labelStats
	prevDigit, prevLower := false, false
	for i := 0; i < len(l); i++ {
		c := l[i]
		isDigit := c >= '0' && c <= '9'
		if isDigit && !prevDigit {
			st.digitRuns++
		}
		isLower := c >= 'a' && c <= 'z'
		isUpper := c >= 'A' && c <= 'Z'
		if isUpper && prevLower {
			st.caseSwitches++
		}
		prevDigit, prevLower = isDigit, isLower
		switch {
		case isDigit:
			st.digits++
		case isLower:
			st.lower++
		case isUpper:
			st.upper++
		case c == '-':
			st.hyphens++
		}
		if isDigit || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' {
			st.hexChars++
		}
		if strings.IndexByte("aeiouAEIOU", c) >= 0 {
			st.vowels++
		}
	}
	return st
}

// suspectLabel applies the encoding and entropy tests to one label.
//
// Entropy alone does not separate data from names at these lengths: real
// compound labels such as "us-central1-docker" (Artifact Registry),
// "europe-west4-aiplatform" or "avatars-githubusercontent" score 3.6-3.8
// bits/char, as much as a 16-character base32 chunk, while hex or base64 of
// ASCII text scores lower. So labels of 16 or more characters are judged on
// shape first (hex with digits; letters with scattered digits and few
// vowels, as base32 has; mixed case, as base64 has; almost no vowels), and a
// high-entropy label is flagged only if it also does not read like words.
func suspectLabel(l string) (bool, string) {
	if len(l) < entropyMinLen {
		return false, ""
	}
	if len(l) >= encodedMinLen {
		if enc := encodedShape(l); enc != "" {
			return true, "looks " + enc + "-encoded"
		}
	}
	st := statsOf(l)
	letters := st.upper + st.lower
	fewVowels := func(ratio float64) bool { return float64(st.vowels) < ratio*float64(letters) }
	core := strings.ReplaceAll(l, "-", "")
	h := entropy(strings.ToLower(core))
	if st.hyphens == 0 {
		switch {
		case st.hexChars == len(l) && st.digits >= 3:
			return true, "looks hex-encoded"
		case st.upper >= 2 && st.lower >= 2 && st.caseSwitches >= 3,
			st.upper >= 3 && st.digits >= 1:
			return true, "looks base64-encoded (mixed case)"
		case st.digitRuns >= 2 && letters > 0 && fewVowels(0.3):
			return true, "looks base32-encoded (scattered digits, few vowels)"
		case letters > 0 && fewVowels(0.2) && h >= 3.0:
			return true, fmt.Sprintf("has almost no vowels (entropy %.2f bits/char)", h)
		}
	}
	if h < entropyLimit {
		return false, ""
	}
	y := strings.Count(strings.ToLower(core), "y")
	switch {
	case st.upper >= 2 && st.lower >= 2:
		return true, fmt.Sprintf("has high entropy (%.2f bits/char) and mixed case", h)
	case st.digitRuns >= 2:
		return true, fmt.Sprintf("has high entropy (%.2f bits/char) and scattered digits", h)
	case letters > 0 && float64(st.vowels+y) < 0.3*float64(letters):
		return true, fmt.Sprintf("has high entropy (%.2f bits/char) and few vowels", h)
	}
	return false, ""
}

// clip quotes a label for a reason, shortened so reasons stay short (and
// the smuggled data is not copied whole into logs).
func clip(l string) string {
	if len(l) > 12 {
		l = l[:12] + "…"
	}
	return fmt.Sprintf("%q", l)
}

// entropy is the Shannon entropy of s in bits per byte.
func entropy(s string) float64 {
	if s == "" {
		return 0
	}
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	n := float64(len(s))
	h := 0.0
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}

// encodedShape returns "hex", "base32" or "base64" if the label has that
// shape, or "".
func encodedShape(l string) string {
	var lower, upper, digits, hexOnly, other int
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case c >= '0' && c <= '9':
			digits++
			hexOnly++
		case c >= 'a' && c <= 'f':
			lower++
			hexOnly++
		case c >= 'A' && c <= 'F':
			upper++
			hexOnly++
		case c >= 'a' && c <= 'z':
			lower++
		case c >= 'A' && c <= 'Z':
			upper++
		default:
			other++ // '-', '_' and anything else
		}
	}
	switch {
	case hexOnly == len(l):
		return "hex"
	case other == 0 && upper >= 2 && lower >= 2 && digits >= 1:
		return "base64"
	case other == 0 && digits >= 2 && lower+upper >= 2:
		return "base32"
	case other <= len(l)/8 && upper >= 3 && lower >= 3 && digits >= 1:
		// URL-safe base64 uses '-' and '_'.
		return "base64"
	}
	return ""
}
