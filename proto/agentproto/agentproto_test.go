package agentproto

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDefinedOnce: the wire constants the agent and its client share are
// spelled only here; a copy as a literal elsewhere (as the agent client
// and the agent once each had) can drift from the other side unnoticed.
// Test files may spell them, to assert the wire as it is.
func TestDefinedOnce(t *testing.T) {
	root := filepath.Join("..", "..")
	literals := []string{`"` + AccessTokenHeader + `"`, `"` + PortUpgrade + `"`, `"` + PortPath + `"`, `"` + UserAuthScheme + `"`}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", "agentproto":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, lit := range literals {
			if strings.Contains(string(b), lit) {
				t.Errorf("%s spells %s: use the agentproto constant", path, lit)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSignature checks the v1 signature against the vector E2B's SDK
// tests use, and the expiry's place in the signed text.
func TestSignature(t *testing.T) {
	tests := []struct {
		path, op, user, token, exp, want string
	}{
		{"hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", "", "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E"},
	}
	for _, tc := range tests {
		if got := Signature(tc.path, tc.op, tc.user, tc.token, tc.exp); got != tc.want {
			t.Errorf("Signature(%q, %q, %q, %q, %q) = %q, want %q", tc.path, tc.op, tc.user, tc.token, tc.exp, got, tc.want)
		}
	}
	if a, b := Signature("p", "read", "", "t", ""), Signature("p", "read", "", "t", "1767225600"); a == b || len(b) != len(a) {
		t.Errorf("an expiry must change the signature and keep its length: %q %q", a, b)
	}
}
