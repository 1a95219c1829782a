package agent

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/corralhq/corral/proto/agentproto"
)

// handlePort serves GET /port/{port} with "Upgrade: corral-tcp"
// (agentproto.PortPath, agentproto.PortUpgrade): it dials
// 127.0.0.1:port inside the sandbox's network namespace and splices the
// hijacked connection to it. This is how the control plane reaches a
// server started in a sandbox that has no network interface at all: the
// tunnel goes over the agent's unix socket, and only to the sandbox's own
// loopback. Requests need the access token like every other call.
func (s *Server) handlePort(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeJSONError(w, http.StatusBadRequest, "port must be 1..65535")
		return
	}
	if r.Header.Get("Upgrade") != agentproto.PortUpgrade {
		writeJSONError(w, http.StatusBadRequest, "expected Upgrade: "+agentproto.PortUpgrade)
		return
	}
	up, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 5*time.Second)
	if err != nil {
		writeJSONError(w, http.StatusBadGateway, "nothing listens on port "+strconv.Itoa(port)+" in the sandbox")
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		writeJSONError(w, http.StatusInternalServerError, "connection cannot be upgraded")
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	defer conn.Close()
	defer up.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+agentproto.PortUpgrade+"\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Bytes the client sent after the request may sit in brw.
		io.Copy(up, brw)
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	io.Copy(conn, up)
	conn.Close()
	wg.Wait()
}
