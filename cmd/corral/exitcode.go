package main

import (
	"errors"

	corral "github.com/corralhq/corral/sdk/go"
)

// exitCoder is an error that carries the process exit code corral should
// exit with (for example the exit code of a command run in a sandbox).
type exitCoder interface {
	error
	ExitCode() int
}

func asExitCoder(err error, target *exitCoder) bool { return errors.As(err, target) }

// exitError makes corral exit with code without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return "exit" }
func (e exitError) ExitCode() int { return e.code }

// ExitCapacity is the exit code of a call refused with capacity_exceeded
// (or too_many_streams): EX_TEMPFAIL, a temporary failure that may
// succeed after the Retry-After the message names (docs/cli.md).
const ExitCapacity = 75

// failureCode is the exit code of an error main prints: ExitCapacity for
// a refusal worth retrying later, else 1.
func failureCode(err error) int {
	if corral.IsCapacityExceeded(err) || errors.Is(err, &corral.APIError{Code: corral.CodeTooManyStreams}) {
		return ExitCapacity
	}
	return 1
}
