//go:build race

package agentclient

// raceEnabled: the race detector makes sync.Pool drop items at random,
// so allocation counts measured in its builds say nothing about the
// code's bounds (the standard library skips its allocation tests there
// too).
const raceEnabled = true
