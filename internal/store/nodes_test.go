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
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s, err := Open(bk.addr(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
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
