package kube

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/corralhq/corral/internal/agent"
)

// agents stands in for the kubelet's part of sandbox Pods, which kwok
// does not play (its Pods run no processes): for every Pod of a namespace
// that kwok reports Running with an IP, it starts a real corral agent on
// 127.0.0.1 with the Pod's bootstrap token, and stops it when the Pod is
// deleted. The driver reaches it through Options.AgentAddr, the one seam
// between the Pod IP and this address: the same TCP path, the same
// bootstrap and init calls as on a cluster.
//
// In process mode each agent is a separate `corral agent --listen`
// process (root) in its own pid and mount namespaces with a private
// tmpfs /home, so the conformance suite's commands (user and root) and
// the processes they leave behind end with it, as a Pod's do. In
// in-process mode the agent is an agent.Server in the test binary (no
// command is run: claim races, reconcile, benchmarks).
type agents struct {
	bin string // the corral binary; "" for in-process agents
	dir string // passwd and group files of process agents

	mu sync.Mutex
	// byUID holds the stand-in of each Pod.
	byUID map[types.UID]*standIn
}

type standIn struct {
	addr    string
	root    string // an in-process agent's CARoot: the sandbox's / for the egress CA
	pod     string
	sandbox string
	stop    func()
	done    chan struct{}
}

// startAgents watches namespace ns of c; bin is the corral binary for
// process agents, "" for in-process ones.
func startAgents(t testing.TB, c *cluster, ns, bin string) *agents {
	t.Helper()
	a := &agents{bin: bin, dir: t.TempDir(), byUID: map[types.UID]*standIn{}}
	if bin != "" {
		if err := os.WriteFile(filepath.Join(a.dir, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(a.dir, "group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	f := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.sync(t, o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { a.sync(t, o.(*corev1.Pod)) },
		DeleteFunc: func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				a.kill(p.UID)
			} else if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				if p, ok := d.Obj.(*corev1.Pod); ok {
					a.kill(p.UID)
				}
			}
		},
	})
	f.Start(stop)
	t.Cleanup(func() {
		close(stop)
		f.Shutdown()
		a.mu.Lock()
		uids := make([]types.UID, 0, len(a.byUID))
		for u := range a.byUID {
			uids = append(uids, u)
		}
		a.mu.Unlock()
		for _, u := range uids {
			a.kill(u)
		}
	})
	return a
}

// addr is the Options.AgentAddr of the driver under test.
func (a *agents) addr(p *corev1.Pod) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.byUID[p.UID]; s != nil {
		return s.addr
	}
	return "127.0.0.1:1" // not started yet: connection refused, the driver retries
}

func (a *agents) sync(t testing.TB, p *corev1.Pod) {
	if p.DeletionTimestamp != nil {
		a.kill(p.UID)
		return
	}
	a.mu.Lock()
	if s := a.byUID[p.UID]; s != nil {
		s.sandbox = p.Labels[LabelSandbox]
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return
	}
	s, err := a.start(p)
	if err != nil {
		t.Errorf("start the agent of Pod %s: %v", p.Name, err)
		return
	}
	a.mu.Lock()
	a.byUID[p.UID] = s
	a.mu.Unlock()
}

func (a *agents) start(p *corev1.Pod) (*standIn, error) {
	boot := bootstrapOf(p)
	s := &standIn{pod: p.Name, sandbox: p.Labels[LabelSandbox], done: make(chan struct{})}
	if a.bin == "" {
		s.root = filepath.Join(a.dir, "root", string(p.UID))
		if err := os.MkdirAll(s.root, 0o755); err != nil {
			return nil, err
		}
		srv, err := agent.New(agent.Config{BootstrapToken: boot, Env: []string{}, DefaultUser: "user", CARoot: s.root})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { srv.Serve(ctx, ln); close(s.done) }()
		s.addr, s.stop = ln.Addr().String(), cancel
		return s, nil
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s.addr = fmt.Sprintf("127.0.0.1:%d", port)
	// In the agent's own mount namespace: a private /home, and the
	// sandbox's users in /etc/passwd and /etc/group (bind mounts the host
	// never sees).
	script := `mount -t tmpfs -o size=64m,mode=755 tmpfs /home && mkdir -m 700 /home/user && chown 1000:1000 /home/user && ` +
		`mount --bind "$CORRAL_TEST_PASSWD" /etc/passwd && mount --bind "$CORRAL_TEST_GROUP" /etc/group && exec "$0" "$@"`
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--propagation", "private",
		"sh", "-c", script, a.bin, "agent", "--listen", s.addr, "--default-user", "user")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CORRAL_AGENT_BOOTSTRAP_TOKEN=" + boot,
		"CORRAL_TEST_PASSWD=" + filepath.Join(a.dir, "passwd"), "CORRAL_TEST_GROUP=" + filepath.Join(a.dir, "group")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	log, err := os.Create(filepath.Join(a.dir, p.Name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); log.Close(); close(s.done) }()
	// unshare --kill-child SIGKILLs the agent, PID 1 of its namespace, so
	// every process of the "Pod" dies with it.
	s.stop = func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return s, nil
}

// root is the directory standing in for the root file system of Pod
// uid's in-process agent ("" if it has none).
func (a *agents) root(uid types.UID) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.byUID[uid]; s != nil {
		return s.root
	}
	return ""
}

// kill stops the stand-in of Pod uid and waits for it to end.
func (a *agents) kill(uid types.UID) {
	a.mu.Lock()
	s := a.byUID[uid]
	a.mu.Unlock()
	if s == nil {
		return
	}
	s.stop()
	<-s.done
}

// leftovers lists what is left of sandbox id: its Pod in the API server,
// and a stand-in agent still running for it. A stand-in's teardown
// follows the Pod's deletion (as a kubelet's does), so it is waited for.
func (a *agents) leftovers(c *cluster, ns, id string) []string {
	var left []string
	l, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelSandbox + "=" + id})
	if err != nil {
		return []string{"list Pods: " + err.Error()}
	}
	for _, p := range l.Items {
		left = append(left, "Pod "+p.Name)
	}
	// While the Pod exists its agent runs; once it is gone, the agent's
	// end may lag the API server by a moment (as a kubelet's teardown).
	wait := 30 * time.Second
	if len(left) > 0 {
		wait = 0
	}
	deadline := time.Now().Add(wait)
	for {
		var running []string
		a.mu.Lock()
		for _, s := range a.byUID {
			if s.sandbox != id {
				continue
			}
			select {
			case <-s.done:
			default:
				running = append(running, "agent of Pod "+s.pod+" at "+s.addr)
			}
		}
		a.mu.Unlock()
		if len(running) == 0 || time.Now().After(deadline) {
			return append(left, running...)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
