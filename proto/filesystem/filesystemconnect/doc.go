// Package filesystemconnect holds the generated Connect RPC client and handler
// of the agent's envd-compatible filesystem service (package filesystem). Regenerate with
// `make proto`.
package filesystemconnect
