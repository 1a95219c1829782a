package runtimetest

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Command is a process start the fake agent was asked for.
type Command struct {
	// Sandbox is the sandbox's id.
	Sandbox string
	// Cmd and Args are the process's argv.
	Cmd  string
	Args []string
	// Env is the sandbox's env with the request's on top.
	Env map[string]string
	// Cwd is the working directory asked for ("" for the user's home).
	Cwd string
	// User is "user" or "root".
	User string
	// Tag is the request's tag.
	Tag string
}

// Line is the command as its caller wrote it: the shell text of the
// wrapper the SDKs and the native exec add ("/bin/bash -l -c TEXT",
// "sh -c TEXT"), else argv joined by spaces.
func (c Command) Line() string {
	switch c.Cmd {
	case "/bin/bash", "bash", "/bin/sh", "sh":
		switch {
		case len(c.Args) == 3 && c.Args[0] == "-l" && c.Args[1] == "-c":
			return c.Args[2]
		case len(c.Args) == 2 && c.Args[0] == "-c":
			return c.Args[1]
		}
	}
	return strings.Join(append([]string{c.Cmd}, c.Args...), " ")
}

// Result is what a scripted process does: it writes Stdout and Stderr,
// then (unless it waits) exits with ExitCode.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
	// Wait keeps the process running after its output until it is
	// signalled (SIGTERM, SIGKILL), its lifetime passes, or its sandbox
	// stops or dies.
	Wait bool
	// For, when Wait is false, keeps the process running this long
	// before it exits (a signal or its lifetime ends it sooner).
	For time.Duration
	// EchoStdin copies the process's stdin to its stdout until stdin is
	// closed, then exits with ExitCode (cat without arguments).
	EchoStdin bool
}

// Responder answers a command: ok false passes it to the next responder.
type Responder func(c Command) (r Result, ok bool)

// Respond registers a responder, tried before those registered earlier
// and before the built-in ones.
func (d *Driver) Respond(r Responder) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.responders = append(d.responders, r)
}

// RespondLine registers a fixed result for commands whose Line is line.
func (d *Driver) RespondLine(line string, res Result) {
	d.Respond(func(c Command) (Result, bool) { return res, c.Line() == line })
}

// answer finds the result for c: the registered responders, newest
// first, then the built-in table.
func (d *Driver) answer(c Command, files *memFS) Result {
	d.mu.Lock()
	rs := append([]Responder(nil), d.responders...)
	d.mu.Unlock()
	for i := len(rs) - 1; i >= 0; i-- {
		if res, ok := rs[i](c); ok {
			return res
		}
	}
	return builtin(c, files)
}

// builtin is the fake agent's table of commands it knows, none of which
// runs anything: echo, true, false, exit N, sleep N, printenv NAME,
// whoami, pwd, cat FILE (from the in-memory files) and cat (stdin to
// stdout). Anything else exits 127 with "command not found", as a shell
// would.
func builtin(c Command, files *memFS) Result {
	fields := strings.Fields(c.Line())
	if len(fields) == 0 {
		return Result{ExitCode: 0}
	}
	name, args := fields[0], fields[1:]
	switch name {
	case "echo":
		return Result{Stdout: strings.Join(args, " ") + "\n"}
	case "true":
		return Result{}
	case "false":
		return Result{ExitCode: 1}
	case "exit":
		n := 0
		if len(args) > 0 {
			n, _ = strconv.Atoi(args[0])
		}
		return Result{ExitCode: n}
	case "sleep":
		if len(args) == 1 {
			if args[0] == "infinity" {
				return Result{Wait: true}
			}
			if s, err := strconv.ParseFloat(args[0], 64); err == nil && s >= 0 && s < 1e6 {
				return Result{For: time.Duration(s * float64(time.Second))}
			}
		}
		return Result{Stderr: "sleep: invalid time interval\n", ExitCode: 1}
	case "printenv":
		if len(args) == 1 {
			if v, ok := c.Env[args[0]]; ok {
				return Result{Stdout: v + "\n"}
			}
			return Result{ExitCode: 1}
		}
	case "whoami":
		return Result{Stdout: c.User + "\n"}
	case "pwd":
		return Result{Stdout: cwdOf(c) + "\n"}
	case "cat":
		if len(args) == 0 {
			return Result{EchoStdin: true}
		}
		var out strings.Builder
		for _, p := range args {
			data, ok := files.read(resolve(p, c.User))
			if !ok {
				return Result{Stdout: out.String(), Stderr: fmt.Sprintf("cat: %s: No such file or directory\n", p), ExitCode: 1}
			}
			out.Write(data)
		}
		return Result{Stdout: out.String()}
	}
	return Result{Stderr: fmt.Sprintf("fake agent: %s: command not found (register a responder)\n", name), ExitCode: 127}
}

// homeOf is the home directory of the fake agent's users.
func homeOf(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/user"
}

func cwdOf(c Command) string {
	if c.Cwd != "" {
		return resolve(c.Cwd, c.User)
	}
	return homeOf(c.User)
}
