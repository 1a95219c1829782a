package agentclient

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/corralhq/corral/proto/agentproto"
)

// PortHandshake asks the agent on c for a tunnel to 127.0.0.1:port inside
// its sandbox and returns the tunnel. The reply's header block is bounded
// (a fake agent could send headers forever); the caller sets c's deadline.
func PortHandshake(c net.Conn, port int, tok string) (net.Conn, error) {
	req := "GET " + agentproto.PortPath + strconv.Itoa(port) + " HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: " +
		agentproto.PortUpgrade + "\r\n" + agentproto.AccessTokenHeader + ": " + tok + "\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		return nil, err
	}
	hg := &headerGuard{r: c, left: maxHeaderBytes}
	br := bufio.NewReader(hg)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	hg.done = true
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, &PortError{Status: resp.StatusCode, Body: string(body)}
	}
	return &bufferedConn{Conn: c, r: br}, nil
}

// PortError is the agent's refusal to open a tunnel (nothing listens).
type PortError struct {
	Status int
	Body   string
}

func (e *PortError) Error() string { return fmt.Sprintf("port tunnel: %d %s", e.Status, e.Body) }

// bufferedConn reads what the response parser buffered before the conn.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
