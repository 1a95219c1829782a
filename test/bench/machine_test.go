package bench

import (
	"bufio"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/runtime/oci"
	"github.com/corralhq/corral/test/bench/results"
	"golang.org/x/sys/unix"
)

// machine collects the facts of the host a run measures.
func machine() results.Machine {
	m := results.Machine{CPUs: goruntime.NumCPU(), Go: goruntime.Version(), LoadBefore: loadavg()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	m.MemTotalMiB = float64(meminfoKiB("MemTotal")) / 1024
	m.Cgroup = "v1 (hybrid)"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		m.Cgroup = "v2"
	}
	m.Runc = firstLineVersion("runc", "--version")
	m.Runsc = runscVersion()
	return m
}

// runscVersion names the runsc corral's gVisor sandboxes run under, as
// the driver picks it (oci.FindRunsc): the pinned build, which reports
// no version of its own ("VERSION_MISSING"), by its pinned version;
// another by its `--version`, with its path. "" when there is none.
func runscVersion() string {
	r, err := oci.FindRunsc("", "")
	if err != nil {
		return ""
	}
	if r.Path == oci.CachedRunsc("") {
		return oci.RunscVersion() + " (pinned build)"
	}
	v := firstLineVersion(r.Path, "--version")
	if r.Legacy {
		v += ", legacy"
	}
	return v + " (" + r.Path + ")"
}

// firstLineVersion runs `bin args` and returns the last word of its
// first line ("runc version 1.1.5+ds1" → "1.1.5+ds1"), or "".
func firstLineVersion(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(line)
	if len(f) == 0 {
		return ""
	}
	return f[len(f)-1]
}

// gitCommit returns HEAD of the checkout, with "-dirty" when the tree
// has uncommitted changes to tracked files.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "-dirty"
	}
	return c
}

// loadavg returns the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// procField returns the value of the first "key : value" line of path.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// meminfoKiB returns a /proc/meminfo field in KiB, or 0.
func meminfoKiB(key string) int64 {
	v := procField("/proc/meminfo", key)
	n, _ := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	return n
}
