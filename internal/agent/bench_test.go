package agent

import (
	"context"
	"testing"
	"time"
)

// BenchmarkStartTrue is the agent's part of an exec round trip: one
// `true` started through the process service over a unix socket (as in
// a sandbox, with a real Connect client), its stream read to the end.
// test/bench's BenchmarkExecRoundTrip measures the whole path.
func BenchmarkStartTrue(b *testing.B) {
	e := newTestEnv(b, nil)
	// The account files were just written: wait until the agent may keep
	// what it parsed of them (userCache), as in a sandbox.
	time.Sleep(racyWindow)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		st, err := e.proc.Start(ctx, startReq("true"))
		if err != nil {
			b.Fatal(err)
		}
		ended := false
		for st.Receive() {
			if st.Msg().GetEvent().GetEnd() != nil {
				ended = true
			}
		}
		if !ended {
			b.Fatalf("no end event: %v", st.Err())
		}
		st.Close()
	}
}
