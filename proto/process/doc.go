// Package process holds the Go code generated from process.proto: the
// agent's envd-compatible process.Process service (start and connect to
// commands and PTYs, list them, send input and signals). The wire facts it
// follows are in docs/e2b-protocol.md. Regenerate with `make proto`.
package process
