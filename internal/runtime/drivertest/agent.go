package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/proto/agentproto"
	"github.com/corralhq/corral/proto/process"
	"github.com/corralhq/corral/proto/process/processconnect"
)

// agentURL is the base URL of agent requests; the host part is ignored,
// connections go through Driver.Dial.
const agentURL = "http://agent"

// execTimeout bounds one command the suite runs in a sandbox. It is a
// deadline against hangs, not a measurement.
const execTimeout = 3 * time.Minute

// result is what a command run through the agent printed and how it ended.
type result struct {
	Stdout, Stderr string
	// End is the agent's end event; nil when the stream broke first (the
	// sandbox died under the command).
	End *process.ProcessEvent_EndEvent
	// Err is the error that broke the stream, if any.
	Err error
}

// exitOK reports whether the command exited with status 0.
func (r result) exitOK() bool {
	return r.End != nil && r.End.GetExited() && r.End.GetExitCode() == 0
}

func (r result) String() string {
	end := "no end event"
	if r.End != nil {
		end = fmt.Sprintf("exited=%v code=%d status=%q", r.End.GetExited(), r.End.GetExitCode(), r.End.GetStatus())
	}
	return fmt.Sprintf("%s, stream error %v, stdout %q, stderr %q", end, r.Err, r.Stdout, r.Stderr)
}

// agent is a Connect client of one sandbox's agent, reached through the
// driver under test.
type agent struct {
	hc    *http.Client
	pc    processconnect.ProcessClient
	token string
	// d and id are the driver and sandbox, for diagnosing a broken
	// stream (diagnose).
	d  runtime.Driver
	id string
}

// newAgent returns a client of sandbox id's agent over d.Dial. Keep-alives
// are off: every call dials anew, so each call exercises Dial (and a
// connection never outlives a pause or a control-plane restart).
func newAgent(d runtime.Driver, id, token string) *agent {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.Dial(ctx, id)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	hc := &http.Client{Transport: tr}
	return &agent{hc: hc, pc: processconnect.NewProcessClient(hc, agentURL), token: token, d: d, id: id}
}

// diagnose says what the host knows of a sandbox whose command stream
// broke (the sandbox died under the command, or its agent did): whether
// the driver sees it alive, its Stats (OOM kills, tasks, memory) and the
// last lines its runtime logged, when the driver keeps a log (AgentLog),
// so that a failure on a loaded CI host says why.
func (a *agent) diagnose() string {
	st, err := a.d.Stats(a.id)
	msg := fmt.Sprintf("sandbox alive %v; stats %+v (%v)", a.d.Alive(a.id), st, err)
	if l, ok := a.d.(interface{ AgentLog(id string) string }); ok {
		msg += "; runtime log: " + l.AgentLog(a.id)
	}
	return msg
}

// run runs script with /bin/sh -c as user ("" for the sandbox's default
// user) and collects its output until it ends.
func (a *agent) run(ctx context.Context, user, script string) result {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
	if a.token != "" {
		req.Header().Set(agentproto.AccessTokenHeader, a.token)
	}
	if user != "" {
		req.Header().Set("Authorization", agentclient.BasicUser(user))
	}
	var res result
	stream, err := a.pc.Start(ctx, req)
	if err != nil {
		res.Err = err
		return res
	}
	defer stream.Close()
	var out, errb bytes.Buffer
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			errb.Write(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			res.End = e
			break
		}
	}
	if res.End == nil {
		res.Err = stream.Err()
		if res.Err == nil {
			res.Err = errors.New("stream ended without an end event")
		}
	}
	res.Stdout, res.Stderr = out.String(), errb.String()
	return res
}

// must runs script and fails the test unless it exits 0; it returns the
// trimmed standard output.
func (a *agent) must(t *testing.T, user, script string) string {
	t.Helper()
	res := a.run(context.Background(), user, script)
	if !res.exitOK() {
		if res.End == nil {
			t.Fatalf("%q as %q: %s; %s", script, orDefault(user), res, a.diagnose())
		}
		t.Fatalf("%q as %q: %s", script, orDefault(user), res)
	}
	return strings.TrimSpace(res.Stdout)
}

func orDefault(user string) string {
	if user == "" {
		return "the default user"
	}
	return user
}

// connectCode is the Connect code of err ("unauthenticated", ...).
func connectCode(err error) string { return connect.CodeOf(err).String() }

// closeConn closes c if the dial made one.
func closeConn(c net.Conn) {
	if c != nil {
		c.Close()
	}
}

// Sh runs script with /bin/sh -c as user ("" for the default user) in
// sandbox id through d.Dial, for a driver's own tests beside the suite.
// It returns the trimmed standard output and an error unless the command
// exited 0.
func Sh(d runtime.Driver, id, token, user, script string) (string, error) {
	res := newAgent(d, id, token).run(context.Background(), user, script)
	if !res.exitOK() {
		return strings.TrimSpace(res.Stdout), fmt.Errorf("%q as %q: %s", script, orDefault(user), res)
	}
	return strings.TrimSpace(res.Stdout), nil
}

// Config returns a Config of a fresh id for s with the suite's base
// limits, for a driver's own tests beside the suite.
func Config(t *testing.T, s Setup) runtime.Config { return config(t, s, baseResources) }
