package safetext

import "testing"

func TestClean(t *testing.T) {
	tests := []struct {
		s                string
		whitespace, want bool
	}{
		{"crawler", false, true},
		{"ünïcode ok", false, true},
		{"a\tb", false, false},
		{"a\tb\nc\r", true, true},
		{"\x1b]0;owned\x07", true, false},
		{"nul\x00", true, false},
		{"del\x7f", true, false},
		{"bad\xffutf8", true, false},
		{"", false, true},
	}
	for _, tc := range tests {
		if got := Clean(tc.s, tc.whitespace); got != tc.want {
			t.Errorf("Clean(%q, %v) = %v, want %v", tc.s, tc.whitespace, got, tc.want)
		}
	}
}
