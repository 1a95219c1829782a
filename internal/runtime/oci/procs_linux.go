package oci

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/cgroups"
	"github.com/corralhq/corral/internal/idrange"
	"github.com/corralhq/corral/internal/runtime"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat
// (100 on every Linux architecture corral supports).
const clockTicks = 100

// Processes lists the processes in the sandbox's cgroup from /proc. Under
// gVisor these are the sentry's and gofer's host processes, not the
// sandboxed ones; the list says so by their commands.
func (d *Driver) Processes(id string) ([]runtime.Process, error) {
	if err := d.held(id); err != nil {
		return nil, err
	}
	pids, err := cgroups.Open(d.cgroupPath(id)).Procs()
	if err != nil {
		return nil, fmt.Errorf("list processes of %s: %w", id, err)
	}
	page := int64(os.Getpagesize())
	out := make([]runtime.Process, 0, len(pids))
	for _, pid := range pids {
		p, err := readProc(pid, page, int(d.opts.UIDBase))
		if err != nil {
			continue // exited meanwhile
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out, nil
}

func readProc(pid int, page int64, uidBase int) (runtime.Process, error) {
	p := runtime.Process{Pid: pid}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return p, err
	}
	// pid (comm) state ppid ... utime(14) stime(15) ... rss(24)
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return p, errors.New("bad stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return p, errors.New("short stat")
	}
	p.State = f[0]
	p.PPid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	p.CPUSeconds = float64(ut+st) / clockTicks
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	p.RSSBytes = rss * page
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				if fs := strings.Fields(rest); len(fs) > 0 {
					uid, _ := strconv.Atoi(fs[0])
					p.UID = uid - uidBase
				}
			}
		}
	}
	switch p.UID {
	case 0:
		p.User = "root"
	case idrange.SandboxUser:
		p.User = "user"
	default:
		p.User = strconv.Itoa(p.UID)
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	cmd = bytes.TrimRight(cmd, "\x00")
	if len(cmd) > 1024 {
		cmd = cmd[:1024]
	}
	p.Command = string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
	if p.Command == "" {
		if j := bytes.IndexByte(stat, '('); j >= 0 {
			p.Command = "[" + string(stat[j+1:i]) + "]"
		}
	}
	return p, nil
}
