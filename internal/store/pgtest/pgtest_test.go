package pgtest

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestStartStop: a server listens on 127.0.0.1 only, runs as a non-root
// user, gives each NewDatabase a database of its own, refuses a wrong
// password, and after Stop its process is gone and its directory
// removed (a test run leaves no server and no cluster behind).
func TestStartStop(t *testing.T) {
	if why := Unavailable(); why != "" && os.Geteuid() != 0 {
		t.Skip(why)
	}
	s, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var addr, who string
	var super bool
	if err := c.QueryRow(ctx, `SELECT host(inet_server_addr()), current_setting('listen_addresses'), usesuper FROM pg_user WHERE usename=current_user`).Scan(&addr, &who, &super); err != nil {
		t.Fatal(err)
	}
	if addr != "127.0.0.1" || who != "127.0.0.1" || !super {
		t.Fatalf("server address %s, listen_addresses %s, superuser %v", addr, who, super)
	}
	c.Close(ctx)
	var st syscall.Stat_t
	if err := syscall.Stat(s.data(), &st); err != nil || st.Uid == 0 {
		t.Fatalf("cluster owned by uid %d (%v): want an unprivileged user", st.Uid, err)
	}
	bad := s.URL("postgres")
	bad = bad[:len("postgres://corral:")] + "x" + bad[len("postgres://corral:")+1:]
	if c, err := pgx.Connect(ctx, bad); err == nil {
		c.Close(ctx)
		t.Fatal("a wrong password connected")
	}
	t.Run("databases", func(t *testing.T) {
		a, b := s.NewDatabase(t), s.NewDatabase(t)
		if a == b {
			t.Fatalf("two tests share database %s", a)
		}
	})
	pid, dir := s.cmd.Process.Pid, s.dir
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("postgres %d still exists after Stop: %v", pid, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s remains after Stop: %v", dir, err)
	}
}
