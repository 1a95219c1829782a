package agentclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/corralhq/corral/internal/agent"
	"github.com/corralhq/corral/proto/process"
)

// TestClientMatchesAgent runs the real agent (internal/agent) on a unix
// socket and talks to it with this package, so that the two sides of the
// wire constants they share (agentproto: the access-token header, the
// port tunnel's path and upgrade token) are checked together: a token the
// client sends is accepted, a wrong one refused, and the port tunnel
// reaches a listener on the sandbox's loopback. It defends against the
// client and the agent drifting apart (they once each spelled the
// constants as literals).
func TestClientMatchesAgent(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:"+dir+":/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Main(ctx, agent.Config{Socket: sock, TokenFile: tok, DefaultUser: "root", PasswdFile: passwd, GroupFile: passwd})
	}()
	defer func() {
		cancel()
		<-done
	}()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	list := func(token string) error {
		_, err := Process(NewHTTP(dial, token)).List(context.Background(), connect.NewRequest(&process.ListRequest{}))
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for list("s3cret") != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the agent does not accept the client's token: %v", list("s3cret"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := list("wrong"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a wrong token: %v, want unauthenticated", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "hello from the sandbox")
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	open := func(token string) (net.Conn, error) {
		c, err := dial(context.Background())
		if err != nil {
			return nil, err
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		tc, err := PortHandshake(c, port, token)
		if err != nil {
			c.Close()
		}
		return tc, err
	}
	var pe *PortError
	if _, err := open("wrong"); !errors.As(err, &pe) || pe.Status != http.StatusUnauthorized {
		t.Fatalf("port tunnel with a wrong token: %v, want a 401 PortError", err)
	}
	tc, err := open("s3cret")
	if err != nil {
		t.Fatalf("port tunnel: %v", err)
	}
	defer tc.Close()
	got, err := io.ReadAll(tc)
	if err != nil || string(got) != "hello from the sandbox" {
		t.Fatalf("through the tunnel: %q, %v", got, err)
	}
}
