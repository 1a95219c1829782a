package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/server"
	corral "github.com/corralhq/corral/sdk/go"
	"github.com/corralhq/corral/test/testserver"
)

// TestPrivatePorts defends against anyone who can reach corral's listener
// reaching an app in a sandbox whose creator asked for private ports
// (native "public_traffic": false; E2B's network.allowPublicTraffic
// false): a request to its port without the sandbox's traffic token, or
// with a wrong one, or with another private sandbox's, is refused with
// 403 traffic_token_required and audited (never with the token); with
// the right token the app answers and never sees the token header; a
// public sandbox's port needs none. The E2B create returns the token as
// trafficAccessToken (null for a public sandbox).
func TestPrivatePorts(t *testing.T) {
	need(t)
	app := `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps([k.lower() for k in self.headers.keys()]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
`
	startApp := func(id string) {
		var start execResult
		call(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
			"command": "cat > /tmp/echo.py <<'EOF'\n" + app + "EOF\n(setsid python3 /tmp/echo.py >/dev/null 2>&1 &)"}, &start)
	}
	type answer struct {
		code    int
		errCode string
		headers []string
	}
	get := func(id, tok string) answer {
		req, _ := http.NewRequest("GET", env.url+"/", nil)
		req.Host = "8000-" + id + ".corral.test"
		if tok != "" {
			req.Header.Set("e2b-traffic-access-token", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		a := answer{code: resp.StatusCode}
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&a.headers); err != nil {
				t.Fatalf("decode the echo: %v", err)
			}
		} else {
			var e struct {
				Code string `json:"code"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&e)
			a.errCode = e.Code
		}
		return a
	}
	// A private sandbox through the native API.
	var nat struct {
		ID            string `json:"id"`
		PublicTraffic bool   `json:"public_traffic"`
		TrafficToken  string `json:"traffic_token"`
	}
	if code := call(t, "POST", "/v1/sandboxes", map[string]any{"public_traffic": false}, &nat); code != http.StatusCreated {
		t.Fatalf("native create: %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/sandboxes/"+nat.ID, nil, nil) })
	if nat.PublicTraffic || nat.TrafficToken == "" {
		t.Fatalf("native private create: public_traffic %v, token %q", nat.PublicTraffic, nat.TrafficToken)
	}
	// A private sandbox and a public one through the E2B API.
	type e2bSbx struct {
		SandboxID          string  `json:"sandboxID"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}
	var priv, pub e2bSbx
	if code := call(t, "POST", "/sandboxes", map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}}, &priv); code != http.StatusCreated {
		t.Fatalf("e2b private create: %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/sandboxes/"+priv.SandboxID, nil, nil) })
	if code := call(t, "POST", "/sandboxes", map[string]any{"templateID": "base"}, &pub); code != http.StatusCreated {
		t.Fatalf("e2b public create: %d", code)
	}
	t.Cleanup(func() { call(t, "DELETE", "/sandboxes/"+pub.SandboxID, nil, nil) })
	if priv.TrafficAccessToken == nil || *priv.TrafficAccessToken == "" || pub.TrafficAccessToken != nil {
		t.Fatalf("trafficAccessToken: private %v, public %v; want a token and null", priv.TrafficAccessToken, pub.TrafficAccessToken)
	}
	privTok := *priv.TrafficAccessToken
	if privTok == nat.TrafficToken {
		t.Fatal("two sandboxes share a traffic token")
	}
	for _, id := range []string{nat.ID, priv.SandboxID, pub.SandboxID} {
		startApp(id)
	}
	waitFor(t, "the public sandbox's echo server", 30*time.Second, func() bool { return get(pub.SandboxID, "").code == 200 })
	waitFor(t, "the private sandboxes' echo servers", 30*time.Second, func() bool {
		return get(nat.ID, nat.TrafficToken).code == 200 && get(priv.SandboxID, privTok).code == 200
	})
	for _, s := range []struct{ id, tok, other string }{{nat.ID, nat.TrafficToken, privTok}, {priv.SandboxID, privTok, nat.TrafficToken}} {
		for _, bad := range []string{"", "wrong-token", s.other} {
			if a := get(s.id, bad); a.code != http.StatusForbidden || a.errCode != "traffic_token_required" {
				t.Fatalf("sandbox %s with token %q: %d %q, want 403 traffic_token_required", s.id, bad, a.code, a.errCode)
			}
		}
		a := get(s.id, s.tok)
		if a.code != 200 {
			t.Fatalf("sandbox %s with its token: %d %q", s.id, a.code, a.errCode)
		}
		for _, h := range a.headers {
			if h == "e2b-traffic-access-token" {
				t.Fatalf("the traffic token header reached the app in sandbox %s", s.id)
			}
		}
	}
	// The refusals are audited, without the token.
	var evs struct {
		Events []json.RawMessage `json:"events"`
	}
	call(t, "GET", "/v1/audit?kind=port.refused&sandbox="+nat.ID, nil, &evs)
	if len(evs.Events) != 3 {
		t.Fatalf("port.refused events of %s: %d, want 3", nat.ID, len(evs.Events))
	}
	for _, e := range evs.Events {
		if strings.Contains(string(e), nat.TrafficToken) || strings.Contains(string(e), privTok) {
			t.Fatalf("an audit event holds a traffic token: %s", e)
		}
	}
}

// TestPortsDefaultPrivate defends against a server started with
// --ports-default private still exposing the ports of a sandbox whose
// create request says nothing: through the Go SDK and the E2B API such a
// sandbox is private (its port refuses a request without its token with
// 403 traffic_token_required), and a request that asks for public ports
// (the SDK's PublicTraffic) still gets them.
func TestPortsDefaultPrivate(t *testing.T) {
	need(t)
	ts, err := testserver.StartWith("../../cmd/corral", slog.LevelWarn, func(c *server.Config) {
		c.NoNetwork = true
		c.PortsDefault = "private"
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ts.Close() })
	ctx := context.Background()
	c := corral.New(ts.URL, ts.Key)
	portStatus := func(id, tok string) (int, string) {
		req, _ := http.NewRequest("GET", ts.URL+"/", nil)
		req.Host = "8000-" + id + ".corral.test"
		if tok != "" {
			req.Header.Set(corral.TrafficTokenHeader, tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct {
			Code string `json:"code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Code
	}
	sb, err := c.Create(ctx, corral.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(ctx)
	if sb.PublicTraffic || sb.TrafficToken == "" {
		t.Fatalf("SDK create on a private-default server: public %v, token %q", sb.PublicTraffic, sb.TrafficToken)
	}
	if st, code := portStatus(sb.ID, ""); st != http.StatusForbidden || code != "traffic_token_required" {
		t.Fatalf("default-private sandbox without token: %d %q", st, code)
	}
	if st, code := portStatus(sb.ID, sb.TrafficToken); st == http.StatusForbidden || code == "traffic_token_required" {
		t.Fatalf("default-private sandbox with its token: %d %q", st, code)
	}
	public := true
	pub, err := c.Create(ctx, corral.CreateOptions{PublicTraffic: &public})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Kill(ctx)
	if !pub.PublicTraffic || pub.TrafficToken != "" {
		t.Fatalf("SDK create with PublicTraffic: public %v, token %q", pub.PublicTraffic, pub.TrafficToken)
	}
	if st, code := portStatus(pub.ID, ""); st == http.StatusForbidden || code == "traffic_token_required" {
		t.Fatalf("public sandbox on a private-default server: %d %q", st, code)
	}
	// The E2B API with no network field.
	body := strings.NewReader(`{"templateID":"base"}`)
	req, _ := http.NewRequest("POST", ts.URL+"/sandboxes", body)
	req.Header.Set("X-API-Key", ts.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e2b struct {
		SandboxID          string  `json:"sandboxID"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e2b); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("e2b create: %d %v", resp.StatusCode, err)
	}
	defer c.Kill(ctx, e2b.SandboxID)
	if e2b.TrafficAccessToken == nil || *e2b.TrafficAccessToken == "" {
		t.Fatal("e2b create on a private-default server: no trafficAccessToken")
	}
	if st, code := portStatus(e2b.SandboxID, ""); st != http.StatusForbidden || code != "traffic_token_required" {
		t.Fatalf("e2b default-private sandbox without token: %d %q", st, code)
	}
}
