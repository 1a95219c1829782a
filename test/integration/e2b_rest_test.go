package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// e2bCall makes an E2B REST call with X-API-KEY and returns status and body.
func e2bCall(t *testing.T, method, path, key string, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, env.url+path, rd)
	req.Header.Set("X-API-KEY", key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestE2BLegacyRoutes: the route set of e2b SDK 2.45 (POST /sandboxes with
// "secure" and allow_internet_access, POST /sandboxes/{id}/connect with a
// required timeout, GET /sandboxes) works, errors carry a numeric code
// equal to the status, and the admin key has the shape the SDK checks.
func TestE2BLegacyRoutes(t *testing.T) {
	need(t)
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(env.key) {
		t.Fatalf("admin key %q does not match ^e2b_[0-9a-f]{40}$", env.key)
	}
	code, body := e2bCall(t, "POST", "/sandboxes", env.key,
		`{"templateID":"base","timeout":300,"secure":true,"allow_internet_access":true,"metadata":{"legacy":"yes"},"envVars":{"A":"1"}}`)
	var sb struct {
		SandboxID, TemplateID, EnvdVersion, EnvdAccessToken string
	}
	if code != 201 || json.Unmarshal(body, &sb) != nil || len(sb.SandboxID) != 20 || sb.EnvdAccessToken == "" || sb.EnvdVersion != "0.6.13" {
		t.Fatalf("legacy create: %d %s", code, body)
	}
	t.Cleanup(func() { e2bCall(t, "DELETE", "/sandboxes/"+sb.SandboxID, env.key, "") })
	if code, body := e2bCall(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", env.key, `{"timeout":300}`); code != 200 || !strings.Contains(string(body), sb.SandboxID) {
		t.Fatalf("legacy connect: %d %s", code, body)
	}
	if code, body := e2bCall(t, "GET", "/sandboxes/"+sb.SandboxID, env.key, ""); code != 200 || !strings.Contains(string(body), `"allowInternetAccess":false`) {
		t.Fatalf("getInfo must say there is no internet access: %d %s", code, body)
	}
	code, body = e2bCall(t, "GET", "/sandboxes", env.key, "")
	if code != 200 || !strings.Contains(string(body), sb.SandboxID) || !strings.Contains(string(body), `"legacy":"yes"`) {
		t.Fatalf("v1 list: %d %s", code, body)
	}
	for _, tc := range []struct {
		method, path, key, body string
		status                  int
	}{
		{"GET", "/sandboxes/nosuchsandbox", env.key, "", 404},
		{"DELETE", "/sandboxes/nosuchsandbox", env.key, "", 404},
		{"POST", "/sandboxes/nosuchsandbox/connect", env.key, `{"timeout":10}`, 404},
		{"POST", "/sandboxes/nosuchsandbox/timeout", env.key, `{"timeout":10}`, 404},
		{"GET", "/sandboxes/" + sb.SandboxID, "e2b_" + strings.Repeat("0", 40), "", 401},
		{"POST", "/sandboxes/nosuchsandbox/snapshots", env.key, `{}`, 404},
		{"POST", "/sandboxes/nosuchsandbox/fork", env.key, `{}`, 404},
		{"DELETE", "/templates/snap-nosuchsnapshot", env.key, "", 404},
		{"POST", "/v2/sandboxes", env.key, `{"templateID":"base","network":{"denyOut":["8.8.8.8"]}}`, 400},
		{"POST", "/v2/sandboxes", env.key, `{"templateID":"nope"}`, 404},
		{"POST", "/v2/sandboxes", env.key, `{"templateID":`, 400},
	} {
		code, body := e2bCall(t, tc.method, tc.path, tc.key, tc.body)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if code != tc.status || json.Unmarshal(body, &e) != nil || e.Code != tc.status || e.Message == "" {
			t.Errorf("%s %s: %d %s; want %d with {\"code\": %d}", tc.method, tc.path, code, body, tc.status, tc.status)
		}
	}
}
