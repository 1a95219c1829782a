package egressd

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/store"
)

// pods is the Pod lookup seam: every address is sandbox id's ("" : none).
type pods struct{ id, why string }

func (p pods) Lookup(netip.Addr) (string, string) { return p.id, p.why }

// TestClientFailsClosed: the proxy's lookup refuses, with a reason, every
// case it cannot establish — no sandbox Pod, a sandbox without a record,
// one that ended, network none's policy is none, a closed store — and
// serves a running sandbox's policy and secrets from the store. It
// defends against a lookup that fails open (the store's trouble or a
// stale record must never become an open policy).
func TestClientFailsClosed(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	al := audit.New(st, nil, nil)
	defer al.Close()
	if err := st.PutSecret(ctx, &store.Secret{Team: store.DefaultTeam, Name: "tok", Hosts: []string{"api.example.com"},
		Header: "Authorization", Value: "Bearer 0123456789abcdef0123"}); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []*store.Sandbox{
		{ID: "run1", Network: "allow", State: store.StateRunning, Egress: store.Egress{Allow: []string{"api.example.com"}, Secrets: []string{"tok"}}},
		{ID: "end1", Network: "all-public", State: store.StateEnded},
		{ID: "none1", Network: "none", State: store.StateRunning},
	} {
		sb.Team, sb.Template, sb.Runtime, sb.CreatedAt, sb.ExpiresAt, sb.AccessToken = store.DefaultTeam, "base", "runc", time.Now(), time.Now().Add(time.Hour), "token-"+sb.ID+"-0123456789"
		if err := st.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	a := netip.MustParseAddr("10.244.0.9")
	lookup := func(p pods) egress.Client {
		s, err := New(Config{Pods: p, Store: st, Audit: al})
		if err != nil {
			t.Fatal(err)
		}
		c, ok := s.Client(a)
		if !ok {
			t.Fatal("Client returned false: the proxy would refuse without the reason")
		}
		return c
	}
	if c := lookup(pods{"run1", ""}); c.Refused != "" || c.ID != "run1" || c.Policy.Mode != egress.ModeAllow || len(c.Secrets) != 1 {
		t.Fatalf("running sandbox: %+v", c)
	}
	if c := lookup(pods{"none1", ""}); c.Refused != "" || c.Policy.Mode != egress.ModeNone || len(c.Secrets) != 0 {
		t.Fatalf("network none: %+v", c)
	}
	for _, tc := range []struct {
		p    pods
		id   string
		want string
	}{
		{pods{"", "source 10.244.0.9 is no sandbox Pod's IP"}, "", "no sandbox Pod"},
		{pods{"gone1", ""}, "gone1", "has no record"},
		{pods{"end1", ""}, "end1", "is ended"},
	} {
		if c := lookup(tc.p); c.ID != tc.id || !strings.Contains(c.Refused, tc.want) || len(c.Secrets) != 0 {
			t.Errorf("%+v: %+v; want refused with %q", tc.p, c, tc.want)
		}
	}
	st.Close()
	if c := lookup(pods{"run1", ""}); c.ID != "run1" || !strings.Contains(c.Refused, "policy store is unreachable") || len(c.Secrets) != 0 {
		t.Fatalf("closed store: %+v; want refused, store unreachable", c)
	}
}
