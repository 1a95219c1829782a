// Package filesystem holds the Go code generated from filesystem.proto:
// the agent's envd-compatible filesystem.Filesystem service (stat, list,
// make, move, remove and watch paths). The wire facts it follows are in
// docs/e2b-protocol.md. Regenerate with `make proto`.
package filesystem
