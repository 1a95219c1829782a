package sandbox

import (
	"errors"
	"math"
	"testing"
)

func TestResolveResources(t *testing.T) {
	light := Tiers["light"]
	tests := []struct {
		name    string
		req     *ResourceRequest
		wantErr bool
	}{
		{"nil keeps tier", nil, false},
		{"override memory", &ResourceRequest{MemoryMB: 1024}, false},
		{"fractional cpu", &ResourceRequest{CPU: 0.25}, false},
		{"negative memory", &ResourceRequest{MemoryMB: -1}, true},
		{"too small memory", &ResourceRequest{MemoryMB: 8}, true},
		{"absurd cpu", &ResourceRequest{CPU: 1e6}, true},
		{"NaN cpu", &ResourceRequest{CPU: math.NaN()}, true},
		{"negative pids", &ResourceRequest{Pids: -3}, true},
		{"huge disk", &ResourceRequest{DiskMB: 1 << 40}, true},
		{"tiny nofile", &ResourceRequest{Nofile: 3}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveResources(light, tc.req)
			var inv *InvalidError
			if tc.wantErr != (err != nil) || (err != nil && !errors.As(err, &inv)) {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			want := light.Resources
			if tc.req != nil && tc.req.MemoryMB != 0 {
				want.MemoryMB = tc.req.MemoryMB
			}
			if tc.req != nil && tc.req.CPU != 0 {
				want.CPU = tc.req.CPU
			}
			if got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestShownCommand(t *testing.T) {
	tests := []struct {
		cmd  string
		args []string
		want string
	}{
		{"/bin/bash", []string{"-l", "-c", "pip install x"}, "pip install x"},
		{"sh", []string{"-c", "ls"}, "ls"},
		{"python3", []string{"-c", "print(1)"}, "python3 -c print(1)"},
		{"/bin/bash", []string{"-l", "script.sh"}, "/bin/bash -l script.sh"},
	}
	for _, tc := range tests {
		if got := shownCommand(tc.cmd, tc.args); got != tc.want {
			t.Errorf("shownCommand(%s %v) = %q, want %q", tc.cmd, tc.args, got, tc.want)
		}
	}
}
