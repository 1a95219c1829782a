package runtime

import (
	"context"
	"sync"
	"time"
)

// Phases of a sandbox's start, in the order they happen. The manager
// records the first ones, a driver the rest (through the Phases that
// WithPhases puts in Start's context); docs/performance.md, "Where create
// time goes", explains each. The names are the values of the phase label
// of corral_create_phase_seconds and the keys of the sandbox.created
// event's phases_ms, so they form a fixed set.
const (
	// PhaseAdmission: validation and waiting for admission (capacity).
	PhaseAdmission = "admission"
	// PhaseStore: the sandbox's record written to the store.
	PhaseStore = "store"
	// PhaseNetwork: the network prepared before the start and the veth
	// pair and policy installed after it (addresses, nftables rules).
	PhaseNetwork = "network"
	// PhaseMounts: the writable layer's tmpfs, the agent's socket
	// directory and the overlay root mounted.
	PhaseMounts = "mounts"
	// PhaseSpec: the OCI runtime spec built and written.
	PhaseSpec = "spec"
	// PhaseSupervisor: the supervisor's part of running the runtime: the
	// request, its start of the runtime's process and the report of its
	// exit (the time the supervisor's client waited minus the runtime's
	// process's life, as the supervisor measured it).
	PhaseSupervisor = "supervisor"
	// PhaseRuntime: the runtime's process from its start to its exit,
	// as the supervisor measured it: `runc run --detach` (made and
	// started), `runsc create` (made) and `runsc start`.
	PhaseRuntime = "runtime"
	// PhaseWatch: the sandbox's init found and watched: its pid file
	// read, its pidfd opened and checked to be of the sandbox's init.
	PhaseWatch = "watch"
	// PhaseState: asking the runtime for the init's state (`runc
	// state`), when the pid file and the cgroup did not settle it. Absent
	// from a create that did not need it.
	PhaseState = "state"
	// PhaseAgent: from there to the agent accepting a connection on its
	// socket (what is left of the agent's own start).
	PhaseAgent = "agent"
	// PhaseFinish: what follows the agent's readiness until the create
	// returns (the sandbox made live, the template's start command).
	PhaseFinish = "finish"
)

// PhaseNames lists every phase in order.
var PhaseNames = []string{PhaseAdmission, PhaseStore, PhaseNetwork, PhaseMounts, PhaseSpec,
	PhaseSupervisor, PhaseRuntime, PhaseWatch, PhaseState, PhaseAgent, PhaseFinish}

// Phases records how long the phases of one sandbox's start took. It is
// safe for concurrent use; a nil *Phases records nothing.
type Phases struct {
	mu sync.Mutex
	// d holds the time spent per phase; guarded by mu.
	d map[string]time.Duration
}

// NewPhases returns an empty record.
func NewPhases() *Phases { return &Phases{d: map[string]time.Duration{}} }

// Mark adds the time since t to phase and returns the current time, so
// that consecutive phases chain: t = p.Mark(PhaseMounts, t).
func (p *Phases) Mark(phase string, t time.Time) time.Time {
	now := time.Now()
	if p == nil {
		return now
	}
	p.mu.Lock()
	p.d[phase] += now.Sub(t)
	p.mu.Unlock()
	return now
}

// Add adds d to phase (for a phase measured by someone else, or one
// that does not chain with Mark).
func (p *Phases) Add(phase string, d time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.d[phase] += d
	p.mu.Unlock()
}

// Milliseconds returns the recorded phases in milliseconds (µs
// resolution), by name.
func (p *Phases) Milliseconds() map[string]float64 {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]float64, len(p.d))
	for k, v := range p.d {
		out[k] = float64(v.Microseconds()) / 1000
	}
	return out
}

type phasesKey struct{}

// WithPhases returns a context whose sandbox start records into p.
func WithPhases(ctx context.Context, p *Phases) context.Context {
	return context.WithValue(ctx, phasesKey{}, p)
}

// PhasesFrom returns the record of ctx, or nil (which records nothing).
func PhasesFrom(ctx context.Context) *Phases {
	p, _ := ctx.Value(phasesKey{}).(*Phases)
	return p
}
