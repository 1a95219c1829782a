package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/runtime"
	corral "github.com/corralhq/corral/sdk/go"
)

// reportCreateTrace reports where the server says the creates of ids
// (made since since) spent their time, from their sandbox.created audit
// events: create_ms (admission to a started sandbox, server side) as
// prefix+"CreateServerSide", and, when the server records them, each
// phase of phases_ms as prefix+"CreatePhase/<phase>" (the phases are the
// server's: docs/performance.md names them). A server that records no
// phases reports create_ms alone.
func reportCreateTrace(b *testing.B, c *corral.Client, since time.Time, ids map[string]bool, prefix string) {
	evs, err := c.Audit(context.Background(), corral.AuditQuery{Kind: "sandbox.created", Since: since.Add(-time.Second)})
	if err != nil {
		b.Logf("create trace: audit: %v", err)
		return
	}
	total := &samples{b: b}
	phases := map[string]*samples{}
	var order []string
	for _, ev := range evs {
		if !ids[ev.Sandbox] {
			continue
		}
		var d struct {
			CreateMS *float64      `json:"create_ms"`
			PhasesMS orderedPhases `json:"phases_ms"`
		}
		if json.Unmarshal(ev.Data, &d) != nil {
			continue
		}
		if d.CreateMS != nil {
			total.add(msDuration(*d.CreateMS))
		}
		for _, p := range d.PhasesMS {
			s := phases[p.name]
			if s == nil {
				s = &samples{b: b}
				phases[p.name] = s
				order = append(order, p.name)
			}
			s.add(msDuration(p.ms))
		}
	}
	total.reportAs(prefix + "CreateServerSide")
	// The server's order of phases (a JSON object is read back sorted by
	// name); phases it does not list come after, as they came.
	slices.SortStableFunc(order, func(a, b string) int {
		return phaseRank(a) - phaseRank(b)
	})
	for _, name := range order {
		phases[name].reportAs(prefix + "CreatePhase/" + name)
	}
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// orderedPhases is a JSON object of phase → milliseconds, in the order
// the server wrote it (its phases' order).
type orderedPhases []struct {
	name string
	ms   float64
}

func (o *orderedPhases) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		var v float64
		if err := dec.Decode(&v); err != nil {
			return err
		}
		*o = append(*o, struct {
			name string
			ms   float64
		}{t.(string), v})
	}
	return nil
}

// phaseRank is a phase's place in runtime.PhaseNames, or after them all.
func phaseRank(name string) int {
	if i := slices.Index(runtime.PhaseNames, name); i >= 0 {
		return i
	}
	return len(runtime.PhaseNames)
}
