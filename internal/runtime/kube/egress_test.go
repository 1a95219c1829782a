package kube

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/egressd"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/store/pgtest"
)

// The cluster egress proxy end to end, without a cloud: a real
// kube-apiserver (the Pods and their watch), a real PostgreSQL (the
// control plane's shared store: records, secrets, audit log) and real
// network namespaces. kwok's Pods run no processes and have no network,
// so a Pod's network is a namespace this test creates whose address IS
// the Pod's IP: a veth pair with the Pod IP on the namespace side and the
// proxy listening on the host side; the namespace has no other route, as
// the NetworkPolicy leaves a sandbox Pod only the proxy. The Pods are
// bound to a node no kubelet (nor kwok) runs, so that the test sets their
// status (phase, Pod IP) itself, as a kubelet would, and can give a new
// Pod the IP of a deleted one. The upstream servers live in another
// namespace the test creates; nothing leaves the machine.

// testNS is a network namespace this test created.
type testNS struct{ name string }

// ip runs ip(8) with args.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// vethNS makes namespace name with a veth pair: nsAddr/30 inside, hostAddr/30
// on the host side. It is removed when t ends.
func vethNS(t *testing.T, tag, role string, hostAddr, nsAddr netip.Addr) (*testNS, error) {
	ns := &testNS{name: "corral-kegress-" + tag + role}
	hostIf, nsIf := "cke"+tag+role+"h", "cke"+tag+role+"n"
	if err := ip("netns", "add", ns.name); err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = ip("link", "del", hostIf); _ = ip("netns", "del", ns.name) })
	for _, args := range [][]string{
		{"link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", ns.name},
		{"addr", "add", hostAddr.String() + "/30", "dev", hostIf},
		{"link", "set", hostIf, "up"},
		{"-n", ns.name, "addr", "add", nsAddr.String() + "/30", "dev", nsIf},
		{"-n", ns.name, "link", "set", nsIf, "up"},
		{"-n", ns.name, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			return nil, err
		}
	}
	return ns, nil
}

// do runs f on a thread inside the namespace, then moves the thread back
// to its own namespace; sockets f made stay in the namespace whoever uses
// them later. The thread must not end with the goroutine: children
// started with Pdeathsig from it (the API server, PostgreSQL) would get
// the signal. Only a thread that could not be moved back is left to end.
func (n *testNS) do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(self)
		fd, err := unix.Open("/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		err = f()
		if unix.Setns(self, unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// dial connects from inside the namespace.
func (n *testNS) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// mapResolver resolves every name to one address (the upstream namespace).
type mapResolver struct{ addr netip.Addr }

func (r mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return []netip.Addr{r.addr}, nil
}

// upstreamLog is what the upstream servers saw.
type upstreamLog struct {
	mu   sync.Mutex
	reqs []string // "host auth"
}

func (u *upstreamLog) add(r *http.Request) {
	u.mu.Lock()
	u.reqs = append(u.reqs, r.Host+" "+r.Header.Get("Authorization"))
	u.mu.Unlock()
}

func (u *upstreamLog) all() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.reqs...)
}

// egressEnv is the test's world.
type egressEnv struct {
	t        *testing.T
	c        *cluster
	ns       string
	pg       *pgtest.Server
	st       *store.Store
	al       *audit.Log
	pods     *PodIPs
	pod      *testNS
	podIP    netip.Addr
	upAddr   netip.Addr
	proxyURL *url.URL
	dnsAddr  string
	caPool   *x509.CertPool
	up       *upstreamLog
	stop     func()
	served   chan error
}

const secretValue = "Bearer sk-live-0123456789abcdef"

func newEgressEnv(t *testing.T) *egressEnv {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if why := pgtest.Unavailable(); why != "" {
		t.Fatal(why)
	}
	c := testCluster(t)
	e := &egressEnv{t: t, c: c, ns: c.namespace(t), up: &upstreamLog{}}
	ctx := context.Background()

	// Networks: the "Pod" and the upstream, at random addresses (another
	// run may hold some: retry).
	var upNS *testNS
	var upAddr netip.Addr
	var err error
	for try := 0; try < 10; try++ {
		var rb [4]byte
		rand.Read(rb[:])
		tag := hex.EncodeToString(rb[:2])
		k := int(rb[2]) % 64
		e.podIP = netip.AddrFrom4([4]byte{10, 246, byte(rb[3]), byte(4*k + 2)})
		hostIP := netip.AddrFrom4([4]byte{10, 246, byte(rb[3]), byte(4*k + 1)})
		if e.pod, err = vethNS(t, tag, "p", hostIP, e.podIP); err != nil {
			continue
		}
		upAddr = netip.AddrFrom4([4]byte{192, 0, 2, byte(4*k + 2)})
		if upNS, err = vethNS(t, tag, "u", netip.AddrFrom4([4]byte{192, 0, 2, byte(4*k + 1)}), upAddr); err != nil {
			continue
		}
		e.proxyURL = &url.URL{Scheme: "http", Host: hostIP.String()}
		e.upAddr = upAddr
		break
	}
	if err != nil {
		t.Fatalf("test networks: %v", err)
	}

	// Upstreams: plain HTTP on :80 and HTTPS (httptest's certificate for
	// example.com) on :443, inside their namespace.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.up.add(r)
		io.WriteString(w, "upstream ok")
	})
	var ln80, ln443 net.Listener
	if err := upNS.do(func() error {
		var err error
		if ln80, err = net.Listen("tcp", netip.AddrPortFrom(upAddr, 80).String()); err != nil {
			return err
		}
		ln443, err = net.Listen("tcp", netip.AddrPortFrom(upAddr, 443).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	plain := &http.Server{Handler: handler}
	go plain.Serve(ln80)
	t.Cleanup(func() { plain.Close() })
	tlsUp := httptest.NewUnstartedServer(handler)
	tlsUp.Listener.Close()
	tlsUp.Listener = ln443
	tlsUp.StartTLS()
	t.Cleanup(tlsUp.Close)
	roots := x509.NewCertPool()
	roots.AddCert(tlsUp.Certificate())

	// The store: a PostgreSQL server of this test's own (it is stopped
	// to test the store being unreachable).
	if e.pg, err = pgtest.Start(pgtest.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.pg.Stop() })
	if err := e.pg.CreateDatabase(ctx, "corral"); err != nil {
		t.Fatal(err)
	}
	if e.st, err = store.Open(e.pg.URL("corral")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.st.Close() })
	e.al = audit.New(e.st, nil, slog.New(slog.DiscardHandler))
	t.Cleanup(e.al.Close)

	ca, err := egress.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The client trusts the egress CA (intercepted TLS) and the upstream
	// (TLS the proxy only tunnels).
	e.caPool = x509.NewCertPool()
	e.caPool.AppendCertsFromPEM(ca.CertPEM())
	e.caPool.AddCert(tlsUp.Certificate())

	// The proxy, as `corral egress-proxy` runs it.
	var srv *egressd.Server
	var mu sync.Mutex
	if e.pods, err = WatchPodIPs(ctx, c.client, e.ns, func(id string) {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			srv.Forget(id)
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pods.Close)
	mu.Lock()
	srv, err = egressd.New(egressd.Config{Pods: e.pods, Store: e.st, Audit: e.al, CA: ca,
		Resolver: mapResolver{upAddr}, UpstreamRoots: roots, StoreTimeout: 5 * time.Second})
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	pln, err := net.Listen("tcp", net.JoinHostPort(e.proxyURL.Host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	e.proxyURL.Host = pln.Addr().String()
	udp, err := net.ListenPacket("udp", net.JoinHostPort(pln.Addr().(*net.TCPAddr).IP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	e.dnsAddr = udp.LocalAddr().String()
	tcp, err := net.Listen("tcp", e.dnsAddr)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	e.served = make(chan error, 1)
	go func() { e.served <- srv.Serve(sctx, pln, udp, tcp) }()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-e.served; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(e.stop)
	return e
}

// sandbox records a running sandbox with a network policy in the store.
func (e *egressEnv) sandbox(id, mode string, allow, secrets []string) {
	e.t.Helper()
	if err := e.st.InsertSandbox(context.Background(), &store.Sandbox{ID: id, Team: store.DefaultTeam, Template: "base", Runtime: "runc",
		Network: mode, State: store.StateRunning, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
		AccessToken: "tok-" + id + "-0123456789", Egress: store.Egress{Allow: allow, Secrets: secrets}}); err != nil {
		e.t.Fatal(err)
	}
}

// runPod creates sandbox id's Pod (on a node nobody runs) and gives it
// the phase and the Pod IP, as a kubelet would. It returns the Pod's name.
func (e *egressEnv) runPod(id string, phase corev1.PodPhase) string {
	e.t.Helper()
	ctx := context.Background()
	pods := e.c.client.CoreV1().Pods(e.ns)
	p, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "corral-" + id, Labels: map[string]string{
			LabelName: nameValue, LabelManagedBy: managedByValue, LabelSandbox: id, LabelState: stateClaimed}},
		Spec: corev1.PodSpec{NodeName: "no-kubelet", ServiceAccountName: "corral-sandbox", AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: containerName, Image: "registry.example/corral/base:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	p.Status.Phase, p.Status.PodIP = phase, e.podIP.String()
	p.Status.PodIPs = []corev1.PodIP{{IP: e.podIP.String()}}
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return p.Name
}

// deletePod deletes a Pod at once (no kubelet would confirm a graceful
// deletion) and waits until the proxy's index no longer has it.
func (e *egressEnv) deletePod(name string) {
	e.t.Helper()
	zero := int64(0)
	if err := e.c.client.CoreV1().Pods(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		e.t.Fatal(err)
	}
	e.waitLookup("", "no sandbox Pod's IP")
}

// waitLookup polls the index until the Pod IP maps to sandbox (or, for
// "", is refused with a reason containing why).
func (e *egressEnv) waitLookup(sandbox, why string) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got, reason := e.pods.Lookup(e.podIP)
		if got == sandbox && strings.Contains(reason, why) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Lookup(%s) = %q, %q after 1 min; want %q, %q", e.podIP, got, reason, sandbox, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get makes a request through the proxy from inside the Pod's namespace.
func (e *egressEnv) get(rawURL string, hdr map[string]string) (*http.Response, string, error) {
	tr := &http.Transport{Proxy: http.ProxyURL(e.proxyURL), DialContext: e.pod.dial, DisableKeepAlives: true}
	tr.TLSClientConfig = tlsConfig(e.caPool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

// events returns the audit log's egress events of sandbox ("" : those
// of no sandbox), after the writer has stored what it queued.
func (e *egressEnv) events(sandbox string) []*store.Event {
	e.t.Helper()
	e.al.Sync()
	evs, err := e.st.ListEvents(context.Background(), store.EventFilter{Kind: "egress"})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*store.Event
	for _, ev := range evs {
		if ev.SandboxID == sandbox {
			out = append(out, ev)
		}
	}
	return out
}

// waitEvent polls the audit log until sandbox has an egress event with
// every fragment in its data (the proxy records an attempt once it has
// finished, which may be after the client has its answer).
func (e *egressEnv) waitEvent(sandbox string, fragments ...string) bool {
	deadline := time.Now().Add(time.Minute)
	for {
		if hasEvent(e.events(sandbox), fragments...) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tlsConfig trusts pool (the egress CA).
func tlsConfig(pool *x509.CertPool) *tls.Config { return &tls.Config{RootCAs: pool} }

// hasEvent reports whether evs hold an event with every fragment in its data.
func hasEvent(evs []*store.Event, fragments ...string) bool {
	for _, ev := range evs {
		ok := true
		for _, f := range fragments {
			if !strings.Contains(string(ev.Data), f) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// dnsQuery asks the DNS filter from inside the Pod's namespace.
func (e *egressEnv) dnsQuery(name string) (int, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	var rcode int
	err := e.pod.do(func() error {
		c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
		r, _, err := c.Exchange(m, e.dnsAddr)
		if err != nil {
			return err
		}
		rcode = r.Rcode
		return nil
	})
	return rcode, err
}

// TestClusterEgress: the cluster egress proxy (`corral egress-proxy`)
// serves a sandbox Pod by its source IP with the sandbox's policy and
// secrets from the shared store, audits every attempt with the sandbox's
// id, refuses what is not a Running sandbox Pod, never lets a new Pod
// that got a deleted Pod's IP use the old sandbox's policy or secrets,
// and fails closed when the store is unreachable or the proxy is down.
// It defends against IP reuse inheriting another sandbox's egress and
// against a failing lookup opening egress.
func TestClusterEgress(t *testing.T) {
	e := newEgressEnv(t)
	ctx := context.Background()
	if err := e.st.PutSecret(ctx, &store.Secret{Team: store.DefaultTeam, Name: "tok", Hosts: []string{"example.com"},
		Header: "Authorization", Value: secretValue}); err != nil {
		t.Fatal(err)
	}
	ph := egress.Secret{Name: "tok"}.Placeholder()
	e.sandbox("sba", "allow", []string{"ok.example.net", "example.com"}, []string{"tok"})
	e.sandbox("sbb", "allow", []string{"b.example.net", "example.com"}, nil)

	t.Run("no sandbox Pod", func(t *testing.T) {
		resp, _, err := e.get("http://ok.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Header.Get("X-Corral-Egress-Refused"), "no sandbox Pod's IP") {
			t.Fatalf("request from an IP no Pod has: %v %v; want 403 naming the reason", resp, err)
		}
		if !e.waitEvent("", `"verdict":"refused"`, "no sandbox Pod") {
			t.Fatal("the refusal is not audited")
		}
	})

	podA := e.runPod("sba", corev1.PodPending)
	t.Run("Pending Pod", func(t *testing.T) {
		e.waitLookup("", "Pending, not Running")
		resp, _, err := e.get("http://ok.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Header.Get("X-Corral-Egress-Refused"), "not Running") {
			t.Fatalf("request from a Pending Pod: %v %v; want 403", resp, err)
		}
	})
	e.deletePod(podA)
	podA = e.runPod("sba", corev1.PodRunning)
	e.waitLookup("sba", "")

	t.Run("allowed", func(t *testing.T) {
		resp, body, err := e.get("http://ok.example.net/x", nil)
		if err != nil || resp.StatusCode != http.StatusOK || body != "upstream ok" {
			t.Fatalf("allowed name: %v %q %v", resp, body, err)
		}
		if !e.waitEvent("sba", `"verdict":"allowed"`, `"host":"ok.example.net"`) {
			t.Fatalf("no allowed event of sba: %v", e.events("sba"))
		}
		// A number for the report, not an assertion: each request costs
		// the Pod lookup and two store reads (connection, request).
		start := time.Now()
		const n = 20
		for range n {
			if resp, _, err := e.get("http://ok.example.net/x", nil); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("allowed name: %v %v", resp, err)
			}
		}
		t.Logf("%d allowed requests through the proxy (new connection each): %v each", n, time.Since(start)/n)
	})
	t.Run("denied", func(t *testing.T) {
		n := len(e.up.all())
		resp, _, err := e.get("http://no.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Corral-Egress-Refused") == "" {
			t.Fatalf("denied name: %v %v; want 403 with a reason", resp, err)
		}
		if !e.waitEvent("sba", `"verdict":"refused"`, `"host":"no.example.net"`) {
			t.Fatal("the denial is not audited with the sandbox")
		}
		if len(e.up.all()) != n {
			t.Fatal("a denied request reached the upstream")
		}
	})
	t.Run("secret only for its host", func(t *testing.T) {
		resp, _, err := e.get("https://example.com/", map[string]string{"Authorization": ph})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("https to the secret's host: %v %v", resp, err)
		}
		resp, _, err = e.get("http://ok.example.net/", map[string]string{"Authorization": ph})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("http to another host: %v %v", resp, err)
		}
		reqs := e.up.all()
		if got := reqs[len(reqs)-2]; got != "example.com "+secretValue {
			t.Fatalf("the secret's host got %q; want the value injected", got)
		}
		if got := reqs[len(reqs)-1]; got != "ok.example.net "+ph {
			t.Fatalf("another host got %q; want the placeholder untouched", got)
		}
		if !e.waitEvent("sba", `"secrets":["tok"]`, `"intercepted":true`) {
			t.Fatal("the injection is not audited")
		}
		if c, err := e.dnsQuery("ok.example.net"); err != nil || c != dns.RcodeSuccess {
			t.Fatalf("DNS of an allowed name: %d %v", c, err)
		}
		if c, err := e.dnsQuery("no.example.net"); err != nil || c != dns.RcodeNameError {
			t.Fatalf("DNS of a denied name: %d %v; want NXDOMAIN (the filter's answer to a name off the list)", c, err)
		}
		if !e.waitEvent("sba", `"mode":"dns"`, `"host":"no.example.net"`, `"verdict":"refused"`) {
			t.Fatal("the DNS refusal is not audited with the sandbox")
		}
	})

	// The Pod is deleted and a Pod of another sandbox, with another
	// policy and no secrets, gets the same IP.
	e.deletePod(podA)
	t.Run("deleted Pod", func(t *testing.T) {
		resp, _, err := e.get("http://ok.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("request from a deleted Pod's IP: %v %v; want 403", resp, err)
		}
	})
	e.runPod("sbb", corev1.PodRunning)
	e.waitLookup("sbb", "")
	t.Run("IP reused", func(t *testing.T) {
		n := len(e.up.all())
		resp, _, err := e.get("http://ok.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("the old sandbox's allowed name from the new Pod: %v %v; want 403 (the new policy)", resp, err)
		}
		resp, _, err = e.get("http://b.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the new sandbox's allowed name: %v %v", resp, err)
		}
		resp, _, err = e.get("https://example.com/", map[string]string{"Authorization": ph})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("https to the old secret's host: %v %v", resp, err)
		}
		for _, r := range e.up.all()[n:] {
			if strings.Contains(r, secretValue) {
				t.Fatalf("the old sandbox's secret reached the upstream from the new Pod: %q", r)
			}
		}
		if got := e.up.all()[len(e.up.all())-1]; got != "example.com "+ph {
			t.Fatalf("upstream got %q; want the placeholder, not injected", got)
		}
		if !e.waitEvent("sbb", `"verdict":"allowed"`, `"host":"b.example.net"`) {
			t.Fatal("the new Pod's traffic is not audited as the new sandbox's")
		}
		for _, ev := range e.events("sba") {
			if strings.Contains(string(ev.Data), "b.example.net") {
				t.Fatalf("the new Pod's traffic audited as the old sandbox's: %s", ev.Data)
			}
		}
	})

	t.Run("store unreachable", func(t *testing.T) {
		n := len(e.up.all())
		if err := e.pg.Halt(); err != nil {
			t.Fatal(err)
		}
		resp, _, err := e.get("http://b.example.net/", nil)
		if err != nil || resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Header.Get("X-Corral-Egress-Refused"), "policy store is unreachable") {
			t.Fatalf("with the store down: %v %v; want 403, store unreachable", resp, err)
		}
		if len(e.up.all()) != n {
			t.Fatal("a request reached the upstream while the store was down")
		}
		if err := e.pg.Resume(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("proxy down", func(t *testing.T) {
		n := len(e.up.all())
		e.stop()
		if resp, _, err := e.get("http://b.example.net/", nil); err == nil {
			t.Fatalf("with the proxy down: %v; want the connection refused", resp.Status)
		}
		// And the Pod has no other way out: nothing but the proxy's
		// address is routed from its namespace.
		if c, err := e.pod.dial(ctx, "tcp", netip.AddrPortFrom(e.upAddr, 80).String()); err == nil {
			c.Close()
			t.Fatal("the Pod's namespace reaches an address directly")
		}
		if len(e.up.all()) != n {
			t.Fatal("a request reached the upstream with the proxy down")
		}
	})
}

// TestEgressRBAC: the egress proxy's account of deploy/kubernetes/egress.yaml
// is enough for its Pod watch (WatchPodIPs) and nothing more: it cannot
// read Secrets or create, patch or delete Pods. Every object of the file
// decodes. It defends against the manifest drifting from the code, and
// against a proxy that could change the sandboxes it serves.
func TestEgressRBAC(t *testing.T) {
	c := testCluster(t)
	applyManifest(t, c, "namespace.yaml")
	// Every object decodes; the proxy's account and its rules are made.
	var account []k8sruntime.Object
	for _, obj := range manifestObjects(t, "egress.yaml") {
		switch obj.(type) {
		case *corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding:
			account = append(account, obj)
		}
	}
	createObjects(t, c, "egress.yaml", account)
	ctx := context.Background()
	client := clientAs(t, c, "corral-egress")
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	const ns = "corral-sandboxes"
	pods, err := WatchPodIPs(wctx, client, ns, nil)
	if err != nil {
		t.Fatalf("the Pod watch as the egress proxy's account: %v", err)
	}
	defer pods.Close()
	// A Pod made after the first listing reaches the index: the watch
	// (not only the list) is allowed.
	e := &egressEnv{t: t, c: c, ns: ns, pods: pods, podIP: netip.MustParseAddr("10.244.200.9")}
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "corral-sandbox"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	name := e.runPod("rbacegress1", corev1.PodRunning)
	e.waitLookup("rbacegress1", "")
	zero := int64(0)
	_ = c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if _, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the egress proxy lists Secrets: %v; want forbidden", err)
	}
	if _, err := client.CoreV1().Pods("corral").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the egress proxy lists Pods of another namespace: %v; want forbidden", err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the egress proxy creates Pods: %v; want forbidden", err)
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "x", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the egress proxy deletes Pods: %v; want forbidden", err)
	}
}
