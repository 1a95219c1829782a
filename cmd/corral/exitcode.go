package main

import "errors"

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
