package agentclient

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestCloseIdleConnectionsReachesTheTransport checks that closing a
// client's idle connections closes them: the token-adding wrapper hid
// the transport's CloseIdleConnections, so a paused or ended sandbox's
// agent connections stayed pooled and a socket replaced by sandbox root
// was never dialled again.
func TestCloseIdleConnectionsReachesTheTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	var dials atomic.Int32
	hc := NewHTTP(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}, "token")
	get := func() {
		resp, err := hc.Get(BaseURL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get()
	get()
	if n := dials.Load(); n != 1 {
		t.Fatalf("two requests dialled %d times, want 1 (a kept-alive connection)", n)
	}
	hc.CloseIdleConnections()
	get()
	if n := dials.Load(); n != 2 {
		t.Fatalf("a request after CloseIdleConnections dialled %d times in all, want 2 (the idle connection closed)", n)
	}
}
