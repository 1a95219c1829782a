package kube

import (
	"regexp"
	"strings"
	"testing"
)

// TestLabelValue: whatever a template or team is called, its label value
// is one the API server accepts (else every create of that template fails
// with an invalid Pod), and distinct long names stay distinct.
func TestLabelValue(t *testing.T) {
	valid := regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	long := strings.Repeat("a", 80)
	for _, tc := range []struct{ in, want string }{
		{"base", "base"},
		{"base:3", "base_3"},
		{"my/template:v1", "my_template_v1"},
		{"_x_", "x"},
		{"", ""},
		{"ünïcode", "n__code"},
	} {
		if got := labelValue(tc.in); got != tc.want {
			t.Errorf("labelValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, in := range []string{long, long + "b", "-" + long + ":", strings.Repeat("é", 40)} {
		got := labelValue(in)
		if len(got) > 63 || !valid.MatchString(got) {
			t.Errorf("labelValue(%q) = %q: not a valid label value", in, got)
		}
	}
	if labelValue(long) == labelValue(long+"b") {
		t.Error("two long names share a label value")
	}
}
