package store

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestSandboxNode: a record names the control plane (node) that runs it,
// on both backends. Defends against control planes sharing one store
// taking each other's sandboxes for their own (a reconcile that ends as
// lost every running record whose sandbox is not on its own host):
//   - the node is stored and read back, and a listing can select one
//     node's records;
//   - rows made before records had a node (node ”) go to the first node
//     that asks (AssignUnowned), once: a second node gets none of them;
//   - of two ends of one record at once exactly one is reported as the
//     one that ended it (EndSandboxFirst), and the first end's reason is
//     kept.
func TestSandboxNode(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		for id, node := range map[string]string{"a1": "node-a", "a2": "node-a", "b1": "node-b", "old1": "", "old2": ""} {
			if err := s.InsertSandbox(ctx, &Sandbox{ID: id, Node: node, Template: "base", Runtime: "runc", Tier: "light",
				State: StateRunning, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
		if rec, err := s.GetSandbox(ctx, "b1"); err != nil || rec.Node != "node-b" {
			t.Fatalf("b1: %+v, %v; want node-b", rec, err)
		}
		ids := func(node string) map[string]bool {
			t.Helper()
			recs, err := s.ListSandboxes(ctx, SandboxFilter{Node: node, States: []string{StateRunning}})
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]bool{}
			for _, r := range recs {
				if node != "" && r.Node != node {
					t.Fatalf("listing of %s holds %s of %q", node, r.ID, r.Node)
				}
				out[r.ID] = true
			}
			return out
		}
		if got := ids("node-a"); len(got) != 2 || !got["a1"] || !got["a2"] {
			t.Fatalf("node-a's records: %v", got)
		}
		if got := ids(""); len(got) != 5 {
			t.Fatalf("every node's records: %v", got)
		}

		if _, err := s.AssignUnowned(ctx, ""); err == nil {
			t.Fatal("AssignUnowned with no node id succeeded")
		}
		if n, err := s.AssignUnowned(ctx, "node-a"); err != nil || n != 2 {
			t.Fatalf("AssignUnowned(node-a) = %d, %v; want the 2 old rows", n, err)
		}
		if n, err := s.AssignUnowned(ctx, "node-b"); err != nil || n != 0 {
			t.Fatalf("AssignUnowned(node-b) = %d, %v; want none (node-a has them)", n, err)
		}
		if got := ids("node-a"); len(got) != 4 || !got["old1"] || !got["old2"] {
			t.Fatalf("node-a's records after the migration: %v", got)
		}

		var wg sync.WaitGroup
		won := make([]bool, 8)
		for i := range won {
			wg.Go(func() {
				ok, err := s.EndSandboxFirst(ctx, "b1", []string{"killed", "ttl"}[i%2], "", now)
				if err != nil {
					t.Error(err)
				}
				won[i] = ok
			})
		}
		wg.Wait()
		n := 0
		for _, w := range won {
			if w {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d of 8 concurrent ends won, want exactly 1", n)
		}
		if rec, _ := s.GetSandbox(ctx, "b1"); rec.State != StateEnded || (rec.EndReason != "killed" && rec.EndReason != "ttl") {
			t.Fatalf("b1 after the ends: %+v", rec)
		}
		if ok, err := s.EndSandboxFirst(ctx, "missing", "killed", "", now); ok || err != nil {
			t.Fatalf("end of a missing record: %v, %v", ok, err)
		}
	})
}

// TestSandboxEndWithEvent: of several ends of one record appended at once
// with their events (Event.EndsSandbox), on both backends, exactly one
// ends the record (Ended), only its event is stored, and its reason is
// the record's; an end of a record that has ended already stores
// nothing, and the events of the batch around it are stored as usual.
// Defends against two control planes ending one sandbox at once (its
// owner's TTL, another's kill) both storing a sandbox.ended event while
// the record has one end.
func TestSandboxEndWithEvent(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		if err := s.InsertSandbox(ctx, &Sandbox{ID: "sb", Node: "node-a", Template: "base", Runtime: "runc", Tier: "light",
			State: StateRunning, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		reasons := []string{"killed", "ttl", "cpu_runaway", "orphaned", "killed", "ttl"}
		ends := make([]*SandboxEnd, len(reasons))
		var wg sync.WaitGroup
		for i, r := range reasons {
			ends[i] = &SandboxEnd{ID: "sb", Reason: r, At: now}
			wg.Go(func() {
				ev := &Event{SandboxID: "sb", Kind: "sandbox.ended", Data: []byte(`{"reason":"` + r + `"}`), EndsSandbox: ends[i]}
				if err := s.AppendEvents(ctx, []*Event{ev}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		rec, err := s.GetSandbox(ctx, "sb")
		if err != nil || rec.State != StateEnded {
			t.Fatalf("sb after the ends: %+v, %v", rec, err)
		}
		n, winner := 0, ""
		for _, e := range ends {
			if e.Ended {
				n, winner = n+1, e.Reason
			}
		}
		evs, err := s.ListEvents(ctx, EventFilter{SandboxID: "sb"})
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 || winner != rec.EndReason || len(evs) != 1 || string(evs[0].Data) != `{"reason":"`+rec.EndReason+`"}` {
			t.Fatalf("%d ends counted, events %v; want 1 and one event with the record's reason %q", n, eventData(evs), rec.EndReason)
		}
		late := &SandboxEnd{ID: "sb", Reason: "error", At: now}
		batch := []*Event{{SandboxID: "sb", Kind: "before"}, {SandboxID: "sb", Kind: "sandbox.ended", EndsSandbox: late}, {SandboxID: "sb", Kind: "after"}}
		if err := s.AppendEvents(ctx, batch); err != nil {
			t.Fatal(err)
		}
		evs, _ = s.ListEvents(ctx, EventFilter{SandboxID: "sb"})
		if late.Ended || len(evs) != 3 || evs[1].Kind != "before" || evs[2].Kind != "after" || batch[1].ID != 0 {
			t.Fatalf("an end of an ended record: ended %v, events %d; want no end and only the batch's other events", late.Ended, len(evs))
		}
		if rec, _ := s.GetSandbox(ctx, "sb"); rec.EndReason != winner {
			t.Fatalf("a late end changed the record: %+v", rec)
		}
	})
}

func eventData(evs []*Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = string(ev.Data)
	}
	return out
}
