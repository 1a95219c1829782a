//go:build !race

package agentclient

// raceEnabled: see race_on_test.go.
const raceEnabled = false
