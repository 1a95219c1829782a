// Package processconnect holds the generated Connect RPC client and handler
// of the agent's envd-compatible process service (package process). Regenerate with
// `make proto`.
package processconnect
