package agentclient

import (
	"context"
	"errors"
	"net"
	"testing"
)

// TestCacheKeepsProcessClient: the process client of a sandbox is made
// once and kept with its HTTP client until Drop, and one made without a
// token (a sandbox that is not running) is never kept. Defends against
// every command building the agent's Connect clients again, and against
// a dropped (paused or ended) sandbox's client being reused.
func TestCacheKeepsProcessClient(t *testing.T) {
	dial := func(context.Context) (net.Conn, error) { return nil, errors.New("no agent") }
	var c Cache
	p1 := c.Process("sb", dial, "tok")
	if p2 := c.Process("sb", dial, "tok"); p2 != p1 {
		t.Fatal("a second call made a new process client")
	}
	if c.HTTP("sb", dial, "tok") != c.byID["sb"].hc {
		t.Fatal("the process client is not kept with the sandbox's HTTP client")
	}
	c.Drop("sb")
	if p3 := c.Process("sb", dial, "tok"); p3 == p1 {
		t.Fatal("a dropped sandbox's process client was reused")
	}
	c.Process("none", dial, "")
	if _, kept := c.byID["none"]; kept {
		t.Fatal("a client without a token was kept")
	}
}
