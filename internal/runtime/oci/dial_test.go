package oci

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestDialRefusesSymlinkedSocket: code in a sandbox controls the agent's
// socket directory; if it swaps agent.sock for a symlink to a host socket
// (a container runtime's, say), the control plane must not connect there.
func TestDialRefusesSymlinkedSocket(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host.sock")
	ln, err := net.Listen("unix", host)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	link := filepath.Join(dir, "agent.sock")
	if err := os.Symlink(host, link); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, "file.sock")
	os.WriteFile(regular, nil, 0o600)
	tests := []struct {
		name string
		path string
		ok   bool
	}{
		{"real socket", host, true},
		{"symlink to a host socket", link, false},
		{"regular file", regular, false},
		{"missing", filepath.Join(dir, "none.sock"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dialNoFollow(context.Background(), tc.path)
			if (err == nil) != tc.ok {
				t.Fatalf("dial %s: err %v, want ok=%v", tc.name, err, tc.ok)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}
