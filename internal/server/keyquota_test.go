package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corralhq/corral/internal/govern"
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
			kq, err := ensureKeyQuota(procKeys{proc}, tc.max, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if kq.Capacity != tc.max || kq.Note != "" {
				t.Errorf("capacity %d note %q after raising, want %d and no note", kq.Capacity, kq.Note, tc.max)
			}
			for name, want := range map[string]string{"maxkeys": tc.wantKeys, "maxbytes": tc.wantBytes} {
				b, _ := os.ReadFile(filepath.Join(dir, name))
				if got := strings.TrimSpace(string(b)); got != want {
					t.Errorf("%s = %s, want %s", name, got, want)
				}
			}
		})
	}
	if _, err := ensureKeyQuota(procKeys{t.TempDir()}, 10, slog.Default()); err == nil {
		t.Error("no error for a missing sysctl")
	}
}

// refusingKeys is a keySysctls whose writes fail with err, as on a
// read-only /proc/sys (EROFS) or in a non-init user namespace (EACCES,
// checked on a real kernel: root of `unshare -U -r` as an unprivileged
// user cannot write kernel.keys.maxkeys).
type refusingKeys struct {
	vals map[string]int64
	err  error
}

func (f *refusingKeys) read(name string) (int64, error) { return f.vals[name], nil }
func (f *refusingKeys) write(name string, v int64) error {
	return &os.PathError{Op: "open", Path: "/proc/sys/kernel/keys/" + name, Err: f.err}
}

// TestKeyQuotaNotRaised defends against a key quota the server cannot
// raise: before, the server either refused to start or (with the quota
// filled) creates failed in runc with "unable to create session key:
// disk quota exceeded", a 500 internal. Now the start logs a warning
// naming the effective capacity, admission is capped there, and the
// create beyond it is refused as capacity (govern.CapacityError, 429
// capacity_exceeded with Retry-After) with a message naming the key
// quota; the sysctl is left as it was.
func TestKeyQuotaNotRaised(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		keys, bytes int64
		max, want   int
		sysctl      string
	}{
		{"read-only /proc/sys, default quota", syscall.EROFS, 200, 20000, 500, 50, "kernel.keys.maxkeys=200"},
		{"user namespace, bytes short", syscall.EACCES, 5000, 20000, 500, 50, "kernel.keys.maxbytes=20000"},
		{"EPERM, both short, the smaller wins", syscall.EPERM, 300, 15000, 500, 25, "kernel.keys.maxkeys=300, kernel.keys.maxbytes=15000"},
		{"quota below the spare: one sandbox", syscall.EROFS, 50, 20000, 20, 1, "kernel.keys.maxkeys=50"},
		{"enough already: no cap", syscall.EROFS, 200, 20000, 40, 40, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := &refusingKeys{vals: map[string]int64{"maxkeys": tc.keys, "maxbytes": tc.bytes}, err: tc.err}
			var logBuf bytes.Buffer
			kq, err := ensureKeyQuota(sys, tc.max, slog.New(slog.NewTextHandler(&logBuf, nil)))
			if err != nil {
				t.Fatalf("a quota that cannot be raised failed the start: %v", err)
			}
			if kq.Capacity != tc.want {
				t.Fatalf("capacity %d, want %d", kq.Capacity, tc.want)
			}
			if sys.vals["maxkeys"] != tc.keys || sys.vals["maxbytes"] != tc.bytes {
				t.Fatalf("quota changed: %v", sys.vals)
			}
			if tc.sysctl == "" {
				if kq.Note != "" || logBuf.Len() != 0 {
					t.Fatalf("no cap expected: note %q log %q", kq.Note, logBuf.String())
				}
				return
			}
			if !strings.Contains(kq.Note, tc.sysctl) {
				t.Errorf("note %q does not name %s", kq.Note, tc.sysctl)
			}
			if l := logBuf.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, fmt.Sprintf("capacity=%d", tc.want)) ||
				!strings.Contains(l, tc.err.Error()) {
				t.Errorf("start log does not warn with the capacity and the cause: %s", l)
			}
			// Admission capped there: creates up to the capacity start,
			// the next is a capacity refusal naming the key quota.
			adm := govern.NewAdmission(govern.AdmissionConfig{MaxConcurrent: kq.Capacity, MaxConcurrentNote: kq.Note,
				MaxPerAgent: 1000, AgentRate: 1000, AgentBurst: 1000})
			for i := range kq.Capacity {
				if _, err := adm.Acquire(context.Background(), govern.Request{Team: "t", Agent: fmt.Sprint("a", i)}); err != nil {
					t.Fatalf("create %d of %d refused: %v", i+1, kq.Capacity, err)
				}
			}
			_, err = adm.Acquire(context.Background(), govern.Request{Team: "t", Agent: "beyond"})
			var capErr *govern.CapacityError
			if !errors.As(err, &capErr) || capErr.Limit != govern.CapacityGlobal || !strings.Contains(capErr.Msg, "key quota") ||
				!strings.Contains(capErr.Msg, tc.sysctl) || capErr.RetryAfter <= 0 {
				t.Fatalf("create beyond the key quota: %v, want a global capacity refusal naming %s", err, tc.sysctl)
			}
		})
	}
}
