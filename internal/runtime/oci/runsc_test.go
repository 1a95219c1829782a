package oci

import (
	"slices"
	"strings"
	"testing"
)

// TestRunscFlags: the platform defaults to systrap (ptrace for a legacy
// runsc, which has no systrap); an unknown platform, or systrap asked of
// a legacy runsc, is refused with a reason instead of failing at the
// first gVisor create. A current runsc keeps writes on the capped layer
// (--overlay2=none) and honours set-user-ID binaries (--allow-suid);
// every runsc loads the spec's seccomp profile (--oci-seccomp); the
// network flag is per sandbox (runscNetworkArgs).
func TestRunscFlags(t *testing.T) {
	for _, tc := range []struct {
		platform string
		legacy   bool
		want     []string // flags that must be there
		refused  string   // part of the error, "" when accepted
	}{
		{"", false, []string{"--platform=systrap", "--host-uds=all", "--overlay2=none", "--allow-suid", "--oci-seccomp"}, ""},
		{"", true, []string{"--platform=ptrace", "--network=none", "--host-uds=all", "--oci-seccomp"}, ""},
		{"ptrace", false, []string{"--platform=ptrace"}, ""},
		{"systrap", true, nil, "predates the systrap platform"},
		{"hypervisor", false, nil, "unknown runsc platform"},
	} {
		p := tc.platform
		got, err := runscFlags(&p, tc.legacy)
		switch {
		case tc.refused != "":
			if err == nil || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("platform %q legacy %v: %v, want an error with %q", tc.platform, tc.legacy, err, tc.refused)
			}
		case err != nil:
			t.Errorf("platform %q legacy %v: %v", tc.platform, tc.legacy, err)
		default:
			for _, f := range tc.want {
				if !slices.Contains(got, f) {
					t.Errorf("platform %q legacy %v: flags %q lack %s", tc.platform, tc.legacy, got, f)
				}
			}
		}
	}
	for _, tc := range []struct {
		legacy bool
		netNS  string
		want   []string
	}{
		{false, "", []string{"--network=none"}},
		{false, "/run/netns/x", []string{"--network=sandbox"}},
		{true, "", nil},
	} {
		if got := runscNetworkArgs(tc.legacy, tc.netNS); !slices.Equal(got, tc.want) {
			t.Errorf("network args (legacy %v, netns %q): %q, want %q", tc.legacy, tc.netNS, got, tc.want)
		}
	}
	if v := RunscVersion(); !strings.HasPrefix(v, "v0.0.0-") || strings.ContainsAny(v, " \n") {
		t.Errorf("pinned runsc version %q", v)
	}
}
