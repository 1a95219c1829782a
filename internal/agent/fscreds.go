package agent

import (
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// origGroups are the agent's supplementary groups, restored after a
// request ran with a user's file-system identity.
var origGroups = func() []uint32 {
	gs, _ := unix.Getgroups()
	out := make([]uint32, len(gs))
	for i, g := range gs {
		out[i] = uint32(g)
	}
	return out
}()

// asFileUser makes file operations (the filesystem service and /files)
// run with the requesting user's file-system identity, so that a request
// as "user" can only read and write what uid 1000 could: the agent is root
// in the sandbox, and without this a caller acting as user would read
// root-only files such as /etc/shadow (a privilege gap inside sandboxes of
// templates without sudo). The handler runs on a locked OS thread whose
// fsuid, fsgid and supplementary groups are the user's; Linux drops the
// file capabilities (CAP_DAC_OVERRIDE, CAP_CHOWN, ...) for a non-zero
// fsuid. TestFileOpsAsUser checks it.
func (s *Server) asFileUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/") && r.URL.Path != "/files" {
			next.ServeHTTP(w, r)
			return
		}
		var u *user
		if r.URL.Path == "/files" {
			u, _ = s.httpUser(r)
		} else {
			u, _, _ = s.rpcUser(r.Header)
		}
		if u == nil || u.UID == 0 {
			next.ServeHTTP(w, r) // the handler reports a bad user itself
			return
		}
		runtime.LockOSThread()
		if err := setFSCreds(u.UID, u.GID, u.Groups); err != nil {
			if restoreFSCreds() == nil {
				runtime.UnlockOSThread()
			}
			writeJSONError(w, http.StatusInternalServerError, fmt.Sprintf("switch to user %s: %v", u.Name, err))
			return
		}
		defer func() {
			// A thread that cannot be restored stays locked to this
			// goroutine and is destroyed when it exits.
			if restoreFSCreds() == nil {
				runtime.UnlockOSThread()
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// noFSUID is true where setfsuid(2) is not implemented: gVisor answers
// it with ENOSYS (gvisor.dev/issue/260) and derives the file-system
// identity from the effective ids, so the thread's effective uid and gid
// are switched instead (setresuid(-1, uid, -1), per thread with the raw
// syscall). The real and saved uid stay 0, so the effective capabilities
// come back when the effective uid returns to 0 (capabilities(7)), and
// while it is not 0 the thread has none, as with a non-zero fsuid.
var noFSUID = func() bool {
	_, err := unix.SetfsuidRetUid(-1)
	return err == unix.ENOSYS
}()

// setFSCreds sets the calling thread's groups, fsgid and fsuid (raw
// syscalls: per thread, unlike syscall.Setgroups), or its effective ids
// where there is no fsuid (noFSUID).
func setFSCreds(uid, gid uint32, groups []uint32) error {
	if err := setThreadGroups(groups); err != nil {
		return err
	}
	if noFSUID {
		return setThreadEffective(uid, gid)
	}
	unix.SetfsgidRetGid(int(gid))
	unix.SetfsuidRetUid(int(uid))
	if cur, _ := unix.SetfsuidRetUid(-1); cur != int(uid) {
		return fmt.Errorf("setfsuid(%d) did not take", uid)
	}
	return nil
}

// restoreFSCreds gives the calling thread root's file-system identity back.
func restoreFSCreds() error {
	if noFSUID {
		if err := setThreadEffective(0, 0); err != nil {
			return err
		}
		return setThreadGroups(origGroups)
	}
	unix.SetfsuidRetUid(0)
	unix.SetfsgidRetGid(0)
	if cur, _ := unix.SetfsuidRetUid(-1); cur != 0 {
		return fmt.Errorf("setfsuid(0) did not take")
	}
	return setThreadGroups(origGroups)
}

// setThreadEffective sets the calling thread's effective uid and gid
// (the gid first while the thread may still change it; back to root the
// uid first, which gives the capabilities back) and checks both took.
func setThreadEffective(uid, gid uint32) error {
	const keep = ^uintptr(0) // -1: leave the real and saved ids
	set := func(nr uintptr, id uint32) error {
		if _, _, e := unix.RawSyscall(nr, keep, uintptr(id), keep); e != 0 {
			return fmt.Errorf("set effective id %d: %w", id, e)
		}
		return nil
	}
	var err error
	if uid == 0 {
		err = errors.Join(set(unix.SYS_SETRESUID, 0), set(unix.SYS_SETRESGID, gid))
	} else {
		err = errors.Join(set(unix.SYS_SETRESGID, gid), set(unix.SYS_SETRESUID, uid))
	}
	if err != nil {
		return err
	}
	euid, _, _ := unix.RawSyscall(unix.SYS_GETEUID, 0, 0, 0)
	egid, _, _ := unix.RawSyscall(unix.SYS_GETEGID, 0, 0, 0)
	if uint32(euid) != uid || uint32(egid) != gid {
		return fmt.Errorf("effective ids %d:%d, not %d:%d", euid, egid, uid, gid)
	}
	return nil
}

func setThreadGroups(groups []uint32) error {
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	return nil
}
