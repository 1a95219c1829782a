package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corralhq/corral/internal/api"
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/sandbox/sandboxtest"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/store/pgtest"
	"github.com/corralhq/corral/internal/template/registry/registrytest"
)

var (
	agentBinOnce sync.Once
	agentBinPath string
	agentBinErr  error
	agentBinDir  string
)

// agentBinary builds the corral binary once per test binary, for
// process agents (TestMain removes it).
func agentBinary(t testing.TB) string {
	t.Helper()
	agentBinOnce.Do(func() {
		if agentBinDir, agentBinErr = os.MkdirTemp("", "corral-kube-bin-"); agentBinErr != nil {
			return
		}
		if agentBinErr = os.Chmod(agentBinDir, 0o755); agentBinErr != nil {
			return
		}
		agentBinPath = filepath.Join(agentBinDir, "corral")
		cmd := exec.Command("go", "build", "-o", agentBinPath, "../../../cmd/corral")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBinErr = fmt.Errorf("build the agent: %v: %s", err, out)
		}
	})
	if agentBinErr != nil {
		t.Fatal(agentBinErr)
	}
	return agentBinPath
}

// testPool is the warm pool serving the API's default creates of the
// registrytest base (the default tier, runc, user "user", and no sudo in
// its empty root file system: no new privileges).
func testPool(size int) Pool {
	r := sandbox.Tiers[sandbox.DefaultTier].Resources
	return Pool{Template: "base", Runtime: runtime.Runc, DefaultUser: "user", NoNewPrivileges: true, Size: size,
		Resources: runtime.Resources{CPU: r.CPU, MemoryBytes: r.MemoryMB << 20, DiskBytes: r.DiskMB << 20, Pids: r.Pids, Nofile: r.Nofile}}
}

// replica is one full control plane as `corral serve --driver kube
// --store postgres://...` runs it: its own store handle, template
// registry, audit log, kube driver (its own API client and Pod watch),
// Manager and HTTP API server, with its own node id.
type replica struct {
	name string
	st   *store.Store
	d    runtime.Driver
	kd   *Driver
	al   *audit.Log
	m    *sandbox.Manager
	http *httptest.Server
	url  string
}

// startReplica starts control plane name over the store at storeURL and
// namespace ns of c, with warm pools. wrap, when set, wraps its driver
// (a test seam).
func startReplica(t testing.TB, c *cluster, ns string, ag *agents, storeURL, name string, pools []Pool, wrap func(*Driver) runtime.Driver) *replica {
	return startReplicaWith(t, c, ns, ag, storeURL, name, func(o *Options) { o.Pools = pools }, wrap)
}

// startReplicaWith is startReplica with the driver's options adjusted by
// mod.
func startReplicaWith(t testing.TB, c *cluster, ns string, ag *agents, storeURL, name string, mod func(*Options), wrap func(*Driver) runtime.Driver) *replica {
	t.Helper()
	st, err := store.Open(storeURL)
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := registrytest.New(t, st)
	kd := newDriver(t, c, ns, ag, name, mod)
	r := &replica{name: name, st: st, kd: kd, d: kd}
	if wrap != nil {
		r.d = wrap(kd)
	}
	r.al = audit.New(st, nil, nil)
	cfg := sandbox.Config{Node: name, WatchInterval: 100 * time.Millisecond, KillGrace: time.Second, Audit: r.al,
		MemoryPressure: func() bool { return false },
		Admission:      govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: 3000, MaxPerAgent: 3000, AgentRate: 10000, AgentBurst: 3000})}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.m = sandbox.New(cfg, st, r.d, reg, log)
	if err := r.m.Reconcile(context.Background()); err != nil {
		t.Fatalf("replica %s: reconcile: %v", name, err)
	}
	h := api.New(api.Config{Audit: r.al, Templates: reg, MaxOutput: 64 << 10}, r.m, st, log)
	r.http = httptest.NewServer(h)
	r.url = r.http.URL
	t.Cleanup(r.close)
	return r
}

func (r *replica) close() {
	if r.http == nil {
		return
	}
	r.http.Close()
	r.m.Shutdown(context.Background(), false)
	r.al.Close()
	r.kd.Close()
	r.st.Close()
	r.http = nil
}

// call sends a JSON request to the replica's API with key and decodes
// the answer into out; it returns the status.
func (r *replica) call(key, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, r.url+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s on %s: %s: %s", method, path, r.name, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode %q: %w", method, path, b, err)
		}
	}
	return resp.StatusCode, nil
}

type sandboxJSON struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	EndReason string `json:"end_reason"`
	Node      string `json:"node"`
}

type execJSON struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// exec runs command in sandbox id through the replica's API.
func (r *replica) exec(key, id, command string) (execJSON, error) {
	var out execJSON
	_, err := r.call(key, http.MethodPost, "/v1/sandboxes/"+id+"/exec", map[string]any{"command": command}, &out)
	return out, err
}

// gatedDriver holds Start until its gate opens: a create caught between
// its record's insert and its Pod.
type gatedDriver struct {
	*Driver
	gate chan struct{}
}

func (g *gatedDriver) Start(ctx context.Context, cfg runtime.Config) (*runtime.Handle, error) {
	<-g.gate
	return g.Driver.Start(ctx, cfg)
}

// TestReplicaCreateInFlight: a control-plane replica that starts (and
// reaps) while another replica's create is in flight — the record
// inserted in the shared PostgreSQL store, the Pod not claimed yet —
// leaves it alone; the create completes and its agent answers its token;
// a kill sent to the replica that did not create it deletes the Pod and
// ends the record once, and the creator forgets it. Defends against the
// starting replica ending the young record as lost (and the sandbox
// being deleted under its creator) and against a kill that only the
// creating replica could carry out.
func TestReplicaCreateInFlight(t *testing.T) {
	c := testCluster(t)
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, "")
	url := pgtest.Shared(t).NewDatabase(t)
	gate := make(chan struct{})
	a := startReplica(t, c, ns, ag, url, "replica-a", nil, func(d *Driver) runtime.Driver { return &gatedDriver{Driver: d, gate: gate} })
	ctx := context.Background()
	inflight := sandboxtest.CreateInFlight(t, a.m, a.st, "replica-a")
	b := startReplica(t, c, ns, ag, url, "replica-b", nil, nil)
	b.m.Reap(ctx)
	if rec := waitRecord(t, b.st, inflight.Record.ID, store.StateRunning); rec.Node != "replica-a" {
		t.Fatalf("the record in flight: %+v", rec)
	}
	close(gate)
	created, err := inflight.Wait()
	if err != nil {
		t.Fatalf("the create in flight: %v", err)
	}
	b.m.Reap(ctx)
	if rec, _ := b.st.GetSandbox(ctx, created.ID); rec.State != store.StateRunning {
		t.Fatalf("after the other replica's reaper: %+v", rec)
	}
	if err := agentList(a.kd, created.ID, created.AccessToken); err != nil {
		t.Fatalf("the sandbox's agent: %v", err)
	}
	if b.m.Running(created.ID) {
		t.Fatal("replica b adopted replica a's sandbox")
	}

	if _, err := b.m.Kill(ctx, created.ID); err != nil {
		t.Fatalf("kill through replica b: %v", err)
	}
	c.waitPodsGone(t, ns, LabelSandbox+"="+created.ID)
	if rec := waitRecord(t, a.st, created.ID, store.StateEnded); rec.EndReason != sandbox.EndKilled {
		t.Fatalf("killed through replica b: %+v", rec)
	}
	deadline := time.Now().Add(time.Minute)
	for a.m.Running(created.ID) {
		if time.Now().After(deadline) {
			t.Fatal("replica a still holds the sandbox replica b killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.al.Sync()
	b.al.Sync()
	evs, err := a.st.ListEvents(ctx, store.EventFilter{SandboxID: created.ID, Kind: "sandbox.ended"})
	if err != nil || len(evs) != 1 {
		t.Fatalf("sandbox.ended events of the sandbox killed through replica b: %d, %v; want 1", len(evs), err)
	}
}

// TestTwoControlPlanesUnderLoad: two full control planes (store handle,
// Manager, kube driver, HTTP API each) on one PostgreSQL store and one
// cluster, one warm pool, under load through the HTTP API: clients
// create sandboxes (claims) on both replicas at once, write a mark in
// each through the API, kill some through the replica that made them
// and some through the other one, and keep the rest. Each "Pod" is a
// real agent process with a private /home (agents_test.go). Defends
// against the failures a shared cluster and store invite:
//   - one Pod handed to two sandboxes (two replicas claiming one idle
//     Pod): every sandbox has a Pod of its own (by UID), and each one's
//     mark, read back through the API at the end, is its own;
//   - a sandbox whose agent the other replica's token or env reached
//     (every create's command through the API answers);
//   - replicas reconciling or reaping each other's sandboxes: every
//     record still running at the end has its Pod, every sandbox Pod has
//     a running record, and after the last kills neither is left.
func TestTwoControlPlanesUnderLoad(t *testing.T) {
	c := testCluster(t)
	if os.Geteuid() != 0 {
		t.Skip("the stand-in agents run commands in their own pid and mount namespaces (root)")
	}
	ns := c.namespace(t)
	ag := startAgents(t, c, ns, agentBinary(t))
	url := pgtest.Shared(t).NewDatabase(t)
	pool := testPool(6)
	reps := []*replica{
		startReplica(t, c, ns, ag, url, "replica-a", []Pool{pool}, nil),
		startReplica(t, c, ns, ag, url, "replica-b", []Pool{pool}, nil),
	}
	key := store.NewKeyValue()
	ctx := context.Background()
	if err := reps[0].st.AddAPIKey(ctx, "admin", key, store.DefaultTeam, store.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	waitPool(t, reps[0].kd, pool.Size)

	const clients, rounds = 6, 5
	type made struct {
		id, pod, node string
		by            int // the replica it was created on
	}
	var mu sync.Mutex
	var kept []made
	podOf := map[string]string{} // Pod UID -> sandbox id
	var wg sync.WaitGroup
	for cl := range clients {
		wg.Go(func() {
			for round := range rounds {
				by := (cl + round) % 2
				rp := reps[by]
				var sb sandboxJSON
				if _, err := rp.call(key, http.MethodPost, "/v1/sandboxes", map[string]any{"timeout": 600}, &sb); err != nil {
					t.Errorf("client %d round %d: create: %v", cl, round, err)
					return
				}
				if sb.Node != rp.name {
					t.Errorf("sandbox %s created on %s names node %q", sb.ID, rp.name, sb.Node)
				}
				l, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSandbox + "=" + sb.ID})
				if err != nil || len(l.Items) != 1 {
					t.Errorf("sandbox %s: Pods %v, %v; want exactly one", sb.ID, len(l.Items), err)
					return
				}
				uid := string(l.Items[0].UID)
				mu.Lock()
				if other, dup := podOf[uid]; dup {
					t.Errorf("Pod %s handed to sandboxes %s and %s", l.Items[0].Name, other, sb.ID)
				}
				podOf[uid] = sb.ID
				mu.Unlock()
				out, err := rp.exec(key, sb.ID, "echo "+sb.ID+" > /home/user/mark && cat /home/user/mark")
				if err != nil || out.ExitCode != 0 || strings.TrimSpace(out.Stdout) != sb.ID {
					t.Errorf("sandbox %s: write its mark: %+v, %v", sb.ID, out, err)
					return
				}
				switch round % 3 {
				case 0: // killed through the replica that made it
					if _, err := rp.call(key, http.MethodDelete, "/v1/sandboxes/"+sb.ID, nil, nil); err != nil {
						t.Errorf("kill %s on its replica: %v", sb.ID, err)
					}
				case 1: // killed through the other replica
					if _, err := reps[1-by].call(key, http.MethodDelete, "/v1/sandboxes/"+sb.ID, nil, nil); err != nil {
						t.Errorf("kill %s on the other replica: %v", sb.ID, err)
					}
				default:
					mu.Lock()
					kept = append(kept, made{id: sb.ID, pod: uid, node: rp.name, by: by})
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := len(podOf); n != clients*rounds {
		t.Fatalf("%d sandboxes made, want %d", n, clients*rounds)
	}
	// Every kept sandbox still holds its own mark: no Pod went to two.
	for _, k := range kept {
		out, err := reps[k.by].exec(key, k.id, "cat /home/user/mark")
		if err != nil || strings.TrimSpace(out.Stdout) != k.id {
			t.Errorf("kept sandbox %s (node %s): its mark reads %+v, %v", k.id, k.node, out, err)
		}
	}
	// Records and Pods agree once the kills' Pods are gone.
	consistent := func(wantRunning int) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			var problems []string
			recs, err := reps[0].st.ListSandboxes(ctx, store.SandboxFilter{States: []string{store.StateRunning, store.StatePaused}})
			if err != nil {
				t.Fatal(err)
			}
			pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSandbox})
			if err != nil {
				t.Fatal(err)
			}
			running := map[string]bool{}
			for _, r := range recs {
				running[r.ID] = true
			}
			withPod := map[string]bool{}
			for _, p := range pods.Items {
				id := p.Labels[LabelSandbox]
				withPod[id] = true
				if !running[id] {
					problems = append(problems, "Pod "+p.Name+" of sandbox "+id+" has no running record")
				}
			}
			for id := range running {
				if !withPod[id] {
					problems = append(problems, "record "+id+" runs without a Pod")
				}
			}
			if len(recs) != wantRunning {
				problems = append(problems, fmt.Sprintf("%d running records, want %d", len(recs), wantRunning))
			}
			if len(problems) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("records and Pods disagree after 2 min: %v", problems)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	consistent(len(kept))
	for i, k := range kept {
		if _, err := reps[i%2].call(key, http.MethodDelete, "/v1/sandboxes/"+k.id, nil, nil); err != nil {
			t.Errorf("kill kept %s: %v", k.id, err)
		}
	}
	consistent(0)
	for _, k := range kept {
		if rec, _ := reps[1].st.GetSandbox(ctx, k.id); rec.EndReason != sandbox.EndKilled {
			t.Errorf("kept sandbox %s ended with %q, want killed", k.id, rec.EndReason)
		}
	}
}
