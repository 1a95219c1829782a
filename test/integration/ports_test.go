package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPortRouting: a server started inside a sandbox (which has no network
// interface) is reachable through corral at the host name
// <port>-<id>.<domain>; a port nobody listens on, an unknown sandbox and a
// killed one answer 502 with E2B's JSON body.
func TestPortRouting(t *testing.T) {
	need(t)
	id := create(t, nil)
	var start execResult
	call(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
		"command": "cd /tmp && echo hello-port > index.html && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)"}, &start)
	get := func(host, path string) (int, string) {
		req, _ := http.NewRequest("GET", env.url+path, nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	host := "8000-" + id + ".corral.test"
	waitFor(t, "the sandbox's HTTP server", 20*time.Second, func() bool {
		code, _ := get(host, "/index.html")
		return code == 200
	})
	if code, body := get(host, "/index.html"); code != 200 || body != "hello-port\n" {
		t.Fatalf("GET through the port route: %d %q", code, body)
	}
	if code, body := get("8001-"+id+".corral.test", "/"); code != 502 || !strings.Contains(body, "nothing listens on port 8001") {
		t.Fatalf("closed port: %d %q", code, body)
	}
	if code, body := get("8000-nosuchsandbox0000000.corral.test", "/"); code != 502 || !strings.Contains(body, `"message":"The sandbox was not found"`) {
		t.Fatalf("unknown sandbox: %d %q", code, body)
	}
	call(t, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	if code, body := get(host, "/index.html"); code != 502 || !strings.Contains(body, `"sandboxId":"`+id+`"`) {
		t.Fatalf("killed sandbox: %d %q", code, body)
	}
}

// TestPortTunnelStripsCredentials defends against the port tunnel handing
// the caller's corral credentials to the app in the sandbox (it forwarded
// X-API-Key and Authorization as they came, so any code in the sandbox
// listening on a port learned the key of whoever called it). An app that
// echoes the headers it receives is reached through <port>-<id>.<domain>:
// X-API-Key, X-Access-Token and an Authorization Bearer carrying a corral
// key (this server's, or any of a corral key's shape) never arrive, while
// the app's own headers, its own Bearer token included, do.
func TestPortTunnelStripsCredentials(t *testing.T) {
	need(t)
	id := create(t, nil)
	app := `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps([[k.lower(), v] for k, v in self.headers.items()]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
`
	var start execResult
	call(t, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
		"command": "cat > /tmp/echo.py <<'EOF'\n" + app + "EOF\n(setsid python3 /tmp/echo.py >/dev/null 2>&1 &)"}, &start)
	host := "8000-" + id + ".corral.test"
	echo := func(hdr map[string]string) (int, map[string][]string) {
		req, _ := http.NewRequest("GET", env.url+"/", nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var pairs [][2]string
		got := map[string][]string{}
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&pairs); err != nil {
				t.Fatalf("decode the echo: %v", err)
			}
		}
		for _, p := range pairs {
			got[p[0]] = append(got[p[0]], p[1])
		}
		return resp.StatusCode, got
	}
	waitFor(t, "the sandbox's echo server", 20*time.Second, func() bool {
		code, _ := echo(nil)
		return code == 200
	})
	lookalike := "e2b_" + strings.Repeat("0a", 20)
	tests := []struct {
		name string
		send map[string]string
		gone []string          // headers that must not arrive
		kept map[string]string // headers that must arrive unchanged
	}{
		{"API key headers", map[string]string{"X-API-Key": env.key, "X-App": "mine"},
			[]string{"x-api-key"}, map[string]string{"x-app": "mine"}},
		{"Bearer API key", map[string]string{"Authorization": "Bearer " + env.key, "X-App": "mine"},
			[]string{"authorization"}, map[string]string{"x-app": "mine"}},
		{"Bearer lookalike key", map[string]string{"Authorization": "bearer " + lookalike},
			[]string{"authorization"}, nil},
		{"envd access token", map[string]string{"X-Access-Token": "some-sandbox-token", "Cookie": "app=1"},
			[]string{"x-access-token"}, map[string]string{"cookie": "app=1"}},
		{"the app's own Bearer", map[string]string{"Authorization": "Bearer app-token-123"},
			nil, map[string]string{"authorization": "Bearer app-token-123"}},
		{"the app's own Basic", map[string]string{"Authorization": "Basic dXNlcjpwdw=="},
			nil, map[string]string{"authorization": "Basic dXNlcjpwdw=="}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, got := echo(tc.send)
			if code != 200 {
				t.Fatalf("echo: %d", code)
			}
			for _, h := range tc.gone {
				if v, ok := got[h]; ok {
					t.Errorf("%s reached the app in the sandbox: %q", h, v)
				}
			}
			for h, want := range tc.kept {
				if v := got[h]; len(v) != 1 || v[0] != want {
					t.Errorf("%s at the app: %q; want %q", h, v, want)
				}
			}
			for _, v := range got {
				for _, s := range v {
					if strings.Contains(s, env.key) {
						t.Errorf("the API key reached the app in header value %q", s)
					}
				}
			}
		})
	}
}
