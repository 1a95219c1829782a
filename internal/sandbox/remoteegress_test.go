package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// TestRemoteEgress: with an egress proxy elsewhere (the kube driver's
// `corral egress-proxy`, Config.RemoteProxyEnv), a sandbox with a network
// gets the proxy variables and its secrets' placeholders (never their
// values) and one with network none gets neither; without it a network is
// refused as before. The policy the remote proxy enforces is
// sandbox.EgressClient of the stored record: the sandbox's allow list and
// its team's secrets while it runs, nothing once it has ended (a killed
// sandbox's policy and secrets must not serve whoever gets its address).
func TestRemoteEgress(t *testing.T) {
	ctx := context.Background()
	env := map[string]string{"HTTP_PROXY": "http://10.96.0.53:3128", "HTTPS_PROXY": "http://10.96.0.53:3128"}
	cfg := testConfig(t)
	cfg.RemoteProxyEnv = env
	h := newHarness(t, cfg)
	if err := h.st.PutSecret(ctx, &store.Secret{Team: store.DefaultTeam, Name: "api", Hosts: []string{"api.example.com"},
		Header: "Authorization", Value: "Bearer s3cr3t-value-long-enough"}); err != nil {
		t.Fatal(err)
	}
	sb := h.create(sandbox.CreateRequest{Network: "allow", Allow: []string{"api.example.com", "example.org"}, Secrets: []string{"api"}})
	rc, _ := h.d.Config(sb.ID)
	ph := egress.Secret{Name: "api"}.Placeholder()
	if rc.Env["HTTP_PROXY"] != env["HTTP_PROXY"] || rc.Env["HTTPS_PROXY"] != env["HTTPS_PROXY"] || rc.Env[ph] != ph {
		t.Fatalf("env of a sandbox with a network: %v; want the proxy variables and the placeholder %s", rc.Env, ph)
	}
	for k, v := range rc.Env {
		if v == "Bearer s3cr3t-value-long-enough" {
			t.Fatalf("secret value in the sandbox's env %s", k)
		}
	}
	none := h.create(sandbox.CreateRequest{})
	if rc, _ := h.d.Config(none.ID); rc.Env["HTTP_PROXY"] != "" || rc.Env["HTTPS_PROXY"] != "" {
		t.Fatalf("env of a sandbox with network none: %v; want no proxy", rc.Env)
	}

	c, err := sandbox.EgressClient(ctx, h.st, h.record(sb.ID), egress.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if c.ID != sb.ID || c.Policy.Mode != egress.ModeAllow || len(c.Secrets) != 1 || c.Secrets[0].Value != "Bearer s3cr3t-value-long-enough" {
		t.Fatalf("EgressClient = %+v", c)
	}
	if ok, _ := c.Policy.AllowsName("example.org"); !ok {
		t.Fatal("allow list not applied")
	}
	if ok, _ := c.Policy.AllowsName("evil.example.net"); ok {
		t.Fatal("a name off the allow list is allowed")
	}
	if c, err := sandbox.EgressClient(ctx, h.st, h.record(none.ID), egress.Limits{}); err != nil || c.Policy.Mode != egress.ModeNone || len(c.Secrets) != 0 {
		t.Fatalf("EgressClient of a none sandbox = %+v, %v", c, err)
	}
	if _, err := h.m.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if c, err := sandbox.EgressClient(ctx, h.st, h.waitEnded(sb.ID), egress.Limits{}); err == nil {
		t.Fatalf("EgressClient of an ended sandbox = %+v; want an error", c)
	}

	// Without a proxy anywhere, a network is refused as before.
	h2 := newHarness(t, testConfig(t))
	if _, err := h2.m.Create(ctx, sandbox.CreateRequest{Network: "all-public"}); !errors.Is(err, sandbox.ErrNetworkUnavailable) {
		t.Fatalf("network without any proxy: %v", err)
	}
}
