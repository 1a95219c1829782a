package egress

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// TestClientRefused: a lookup that knows an address but may not serve it
// (a Pod that is not Running, an unreadable policy store) makes the proxy
// refuse every attempt from it with the lookup's reason, audited with the
// sandbox id, even when the policy it returned would allow the request. It
// defends against a lookup failing open.
func TestClientRefused(t *testing.T) {
	pol, err := ParsePolicy("all-public", nil)
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	p := NewProxy(ProxyConfig{
		Client: func(netip.Addr) (Client, bool) {
			return Client{ID: "sb1", Policy: pol, Refused: "policy store unreachable"}, true
		},
		OnEvent: func(ev Event) { evs = append(evs, ev) },
	})
	for _, method := range []string{http.MethodGet, http.MethodConnect} {
		target := "http://example.com/"
		if method == http.MethodConnect {
			target = "example.com:443"
		}
		req := httptest.NewRequest(method, target, nil)
		if method == http.MethodConnect {
			req.Host = "example.com:443"
		}
		req.RemoteAddr = "10.0.0.2:40000"
		rec := httptest.NewRecorder()
		evs = nil
		p.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || rec.Header().Get("X-Corral-Egress-Refused") != "policy store unreachable" {
			t.Fatalf("%s: %d %q, want 403 with the lookup's reason", method, rec.Code, rec.Header().Get("X-Corral-Egress-Refused"))
		}
		if len(evs) != 1 || evs[0].Sandbox != "sb1" || evs[0].Verdict != VerdictRefused || evs[0].Reason != "policy store unreachable" {
			t.Fatalf("%s: events %+v, want one refusal of sb1 with the reason", method, evs)
		}
	}
}
