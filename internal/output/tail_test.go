package output

import (
	"strings"
	"testing"
)

func TestTail(t *testing.T) {
	tests := []struct {
		name      string
		max       int
		writes    []string
		want      string
		total     int64
		truncated bool
	}{
		{"fits", 10, []string{"abc", "def"}, "abcdef", 6, false},
		{"exact", 6, []string{"abc", "def"}, "abcdef", 6, false},
		{"keeps tail across writes", 4, []string{"abc", "def"}, "cdef", 6, true},
		{"one big write", 3, []string{"abcdefgh"}, "fgh", 8, true},
		{"many small", 5, strings.Split("abcdefghijklmnop", ""), "lmnop", 16, true},
		{"cut utf8 rune dropped", 2, []string{"x€"}, "", 4, true},
		{"whole utf8 rune kept", 3, []string{"x€"}, "€", 4, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tl := &Tail{Max: tc.max}
			for _, w := range tc.writes {
				tl.Write([]byte(w))
			}
			if got := tl.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			if tl.Total != tc.total || tl.Truncated() != tc.truncated {
				t.Errorf("Total=%d Truncated=%v, want %d %v", tl.Total, tl.Truncated(), tc.total, tc.truncated)
			}
		})
	}
}
