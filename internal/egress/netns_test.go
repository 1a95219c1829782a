package egress

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testNetns is a network namespace created by a test, reachable from the
// host through a veth pair and a host route to one documentation-range
// address (RFC 5737) that lives inside it. No traffic leaves the machine:
// the address is only routed to the veth.
type testNetns struct {
	name     string
	hostIf   string
	upstream netip.Addr // inside the namespace, routed via the veth
}

// newTestNetns creates the namespace, the veth pair (host side
// 198.51.100.(4k+1)/30, namespace side .(4k+2)/30), puts 203.0.113.x/32 on
// the namespace's loopback, adds the host route 203.0.113.x/32 via the
// namespace side, and checks with `ip route get` that the route goes via
// the veth before returning. Everything is removed in t.Cleanup. It skips
// when not root or when ip(8) is missing.
func newTestNetns(t testing.TB) *testNetns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) from iproute2")
	}
	// Addresses are picked at random; another test (or package) may hold
	// the same ones, which makes a step fail with "File exists": undo and
	// try other addresses.
	var last error
	for try := 0; try < 10; try++ {
		n, undo, err := tryTestNetns()
		if err == nil {
			t.Cleanup(undo)
			return n
		}
		undo()
		last = err
	}
	t.Fatalf("create test network namespace: %v", last)
	return nil
}

func tryTestNetns() (*testNetns, func(), error) {
	var rb [4]byte
	if _, err := rand.Read(rb[:]); err != nil {
		return nil, func() {}, err
	}
	tag := hex.EncodeToString(rb[:3])
	k := int(rb[3]) % 64 // which /30 of 198.51.100.0/24
	n := &testNetns{
		name:     "corral-egress-test-" + tag,
		hostIf:   "ceg" + tag + "h",
		upstream: netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + int(rb[0])%240)}),
	}
	nsIf := "ceg" + tag + "n"
	hostIP := fmt.Sprintf("198.51.100.%d", 4*k+1)
	nsIP := fmt.Sprintf("198.51.100.%d", 4*k+2)
	up := n.upstream.String()

	var undos []func()
	undo := func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
	}
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	steps := []struct {
		args []string
		undo []string
	}{
		{[]string{"netns", "add", n.name}, []string{"netns", "del", n.name}},
		{[]string{"link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf}, []string{"link", "del", n.hostIf}},
		{[]string{"link", "set", nsIf, "netns", n.name}, nil},
		{[]string{"addr", "add", hostIP + "/30", "dev", n.hostIf}, nil},
		{[]string{"link", "set", n.hostIf, "up"}, nil},
		{[]string{"-n", n.name, "link", "set", "lo", "up"}, nil},
		{[]string{"-n", n.name, "addr", "add", nsIP + "/30", "dev", nsIf}, nil},
		{[]string{"-n", n.name, "link", "set", nsIf, "up"}, nil},
		{[]string{"-n", n.name, "addr", "add", up + "/32", "dev", "lo"}, nil},
		{[]string{"route", "add", up + "/32", "via", nsIP, "dev", n.hostIf}, []string{"route", "del", up + "/32", "via", nsIP}},
	}
	for _, st := range steps {
		if err := ip(st.args...); err != nil {
			return nil, undo, err
		}
		if st.undo != nil {
			u := st.undo
			undos = append(undos, func() { _ = exec.Command("ip", u...).Run() })
		}
	}
	// The route must go via our veth before any test traffic flows.
	out, err := exec.Command("ip", "route", "get", up).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "via "+nsIP+" dev "+n.hostIf) {
		return nil, undo, fmt.Errorf("route to %s does not go via the test veth: %q", up, out)
	}
	return n, undo, nil
}

// listen opens a TCP listener on addr inside the namespace. The socket keeps
// the namespace after the thread returns to the host's.
func (n *testNetns) listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + n.name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		l, lerr := net.Listen("tcp", addr)
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: the runtime discards it when this
			// goroutine exits, so no other goroutine runs in the namespace.
			ch <- result{l, lerr}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{l, lerr}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen %s in netns %s: %v", addr, n.name, r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	return r.l
}
