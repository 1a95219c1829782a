package integration

import (
	"os/exec"
	"testing"
)

// needGVisor skips when runsc is not installed.
func needGVisor(t *testing.T) {
	t.Helper()
	need(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc (gVisor) is not installed: apt-get install runsc")
	}
}

func TestGVisorSmoke(t *testing.T) {
	needGVisor(t)
	id := create(t, map[string]any{"runtime": "gvisor"})
	t.Log(mustSh(t, id, "id; uname -a; cat /proc/self/uid_map; dmesg | head -3"))
	out, _ := exec.Command("sh", "-c", "ls /sys/fs/cgroup/pids/corral/; cat /sys/fs/cgroup/pids/corral/"+id+"/pids.max /sys/fs/cgroup/pids/corral/"+id+"/cgroup.procs; cat /sys/fs/cgroup/memory/corral/"+id+"/memory.limit_in_bytes; ps -eo pid,user,comm | grep runsc").CombinedOutput()
	t.Logf("%s", out)
}

// eachRuntime runs fn once per runtime as subtests, the same suite for
// runc and runsc (gVisor), as containerd runs one suite for every
// snapshotter.
func eachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	t.Run("runc", func(t *testing.T) { need(t); fn(t, "runc") })
	t.Run("gvisor", func(t *testing.T) { needGVisor(t); fn(t, "gvisor") })
}
