package bench

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/proto/process"
)

// BenchmarkAgentAB compares two builds of the agent in one run: the
// benchmark's own (A, built from this checkout) and the binary named by
// CORRAL_BENCH_AGENT_B (B; without it the benchmark skips: it is a tool
// for measuring a change to the agent's start). In each iteration, in
// random order with BenchmarkColdPaired's settle before each, it starts
// the agent of A and of B as corral's driver would (corral's mounts and
// spec, `runc run -d`) and times, for each, the start until the agent's
// socket accepts (AgentAB{A,B}Ready), then the first command (`/bin/true`
// through the agent's Process.Start, as the control plane sends it:
// AgentAB{A,B}First) and a second one (AgentAB{A,B}Second).
func BenchmarkAgentAB(b *testing.B) {
	need(b)
	other := os.Getenv("CORRAL_BENCH_AGENT_B")
	if other == "" {
		skip(b, "CORRAL_BENCH_AGENT_B names no second agent binary to compare with")
	}
	a := newAgentReady(b, newRawRunc(b))
	// B where sandbox root can reach it, as the server's agent binary.
	dir, err := os.MkdirTemp(env.tmp, "agent-b-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	binB := filepath.Join(dir, "corral-agent")
	if err := copyFile(other, binB, 0o755); err != nil {
		b.Fatal(err)
	}
	bins := map[string]string{"A": env.agentBin, "B": binB}
	s := map[string]*samples{}
	for _, k := range []string{"AReady", "AFirst", "ASecond", "BReady", "BFirst", "BSecond"} {
		s[k] = newSamples(b)
	}
	st := &pairedSettle{}
	for i := 0; i < b.N; i++ {
		order := []string{"A", "B"}
		if i%2 == 1 {
			order = []string{"B", "A"}
		}
		for _, k := range order {
			st.wait(b)
			a.setAgent(bins[k])
			a.runWith(b, s[k+"Ready"], func() {
				dial := func(ctx context.Context) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", filepath.Join(a.dir, "run", "agent.sock"))
				}
				pc := agentclient.Process(agentclient.NewHTTP(dial, "bench-token"))
				for _, name := range []string{"First", "Second"} {
					t0 := time.Now()
					if err := runTrue(pc); err != nil {
						b.Fatalf("agent %s: %s command: %v", k, name, err)
					}
					s[k+name].add(time.Since(t0))
				}
			})
		}
	}
	for _, k := range []string{"AReady", "BReady", "AFirst", "BFirst", "ASecond", "BSecond"} {
		s[k].reportAs("AgentAB" + k)
	}
}

// runTrue runs /bin/true through the agent's Process.Start as root and
// reads its events to the end.
func runTrue(pc interface {
	Start(context.Context, *connect.Request[process.StartRequest]) (*connect.ServerStreamForClient[process.StartResponse], error)
}) error {
	no := false
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/true"}, Stdin: &no})
	req.Header().Set("Authorization", agentclient.BasicUser("root"))
	stream, err := pc.Start(context.Background(), req)
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
	}
	return stream.Err()
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
