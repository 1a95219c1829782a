//go:build !race

package sandbox

// raceEnabled: see race_on_test.go.
const raceEnabled = false
