package pool

import (
	"strings"
	"testing"
)

func TestAvailableFraction(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		want   float64
		wantOK bool
	}{
		{"normal", "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:    6000000 kB\n", 0.25, true},
		{"under the floor", "MemTotal: 1000 kB\nMemAvailable: 50 kB\n", 0.05, true},
		{"no MemAvailable (old kernel)", "MemTotal: 1000 kB\nMemFree: 10 kB\n", 0, false},
		{"no MemTotal", "MemAvailable: 10 kB\n", 0, false},
		{"garbage", "MemTotal: x kB\nMemAvailable: 5 kB\n\n:\n", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := availableFraction(strings.NewReader(tc.in))
			if ok != tc.wantOK || got != tc.want {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
