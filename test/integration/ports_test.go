package integration

import (
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
