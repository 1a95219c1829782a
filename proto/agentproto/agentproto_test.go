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
