package main

import (
	"errors"
	"fmt"
	"testing"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestFailureCode: a refusal worth retrying later (capacity_exceeded,
// too_many_streams) exits 75 however it is wrapped, so that scripts can
// tell it from a failure; every other error exits 1.
func TestFailureCode(t *testing.T) {
	capacity := &corral.APIError{Status: 429, Code: corral.CodeCapacityExceeded, Message: "all 1 sandbox slots are in use"}
	streams := &corral.APIError{Status: 429, Code: corral.CodeTooManyStreams, Message: "this API key holds 2 streams open"}
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"capacity", capacity, ExitCapacity},
		{"capacity, trimmed and wrapped", trimmedError{fmt.Errorf("create: %w", capacity)}, ExitCapacity},
		{"too many streams", trimmedError{streams}, ExitCapacity},
		{"not found", &corral.APIError{Status: 404, Code: corral.CodeNotFound}, 1},
		{"transport", errors.New("connection refused"), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := failureCode(tc.err); got != tc.want {
				t.Fatalf("failureCode(%v) = %d; want %d", tc.err, got, tc.want)
			}
		})
	}
}
