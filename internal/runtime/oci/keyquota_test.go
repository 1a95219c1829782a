package oci

import "testing"

// TestRuncKeyQuotaFull pins the recognition of runc's key-quota failure
// (reported as runtime.ErrKeyQuota, answered 429 capacity_exceeded)
// to runc's wording, and keeps other quota failures (a full disk) out.
func TestRuncKeyQuotaFull(t *testing.T) {
	tests := []struct {
		text string
		want bool
	}{
		{`runc run: exit status 1: time="2026-12-02T07:00:00Z" level=error msg="runc run failed: unable to start container process: ` +
			`error during container init: unable to join session keyring: unable to create session key: disk quota exceeded"`, true},
		{`runc run: exit status 1: write /run/corral/x/state.json: disk quota exceeded`, false},
		{`runc run: exit status 1: unable to join session keyring: permission denied`, false},
	}
	for _, tc := range tests {
		if got := runcKeyQuotaFull(tc.text); got != tc.want {
			t.Errorf("runcKeyQuotaFull(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}
