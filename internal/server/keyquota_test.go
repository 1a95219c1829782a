package server

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnsureKeyQuota checks that the per-user key quota is raised to fit
// --max-sandboxes and never lowered: with the kernel's default (200 keys)
// a host stopped creating runc sandboxes at about 190, whatever the
// admission limit said.
func TestEnsureKeyQuota(t *testing.T) {
	for _, tc := range []struct {
		name                string
		max                 int
		keys, bytes         string
		wantKeys, wantBytes string
	}{
		{"default host, default limit: unchanged", 10, "200", "20000", "200", "20000"},
		{"500 sandboxes: raised", 500, "200", "20000", "1100", "110000"},
		{"already larger: never lowered", 500, "5000", "1000000", "5000", "1000000"},
		{"keys enough, bytes short", 500, "2000", "20000", "2000", "110000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			dir := filepath.Join(proc, "sys", "kernel", "keys")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			write := func(name, v string) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("maxkeys", tc.keys)
			write("maxbytes", tc.bytes)
			if err := ensureKeyQuota(proc, tc.max, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]string{"maxkeys": tc.wantKeys, "maxbytes": tc.wantBytes} {
				b, _ := os.ReadFile(filepath.Join(dir, name))
				if got := strings.TrimSpace(string(b)); got != want {
					t.Errorf("%s = %s, want %s", name, got, want)
				}
			}
		})
	}
	if err := ensureKeyQuota(t.TempDir(), 10, slog.Default()); err == nil {
		t.Error("no error for a missing sysctl")
	}
}
