package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/actor"
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

const (
	alphaStreamKey = "e2b_alpha0000000000000000000000000000000001"
	betaStreamKey  = "e2b_beta00000000000000000000000000000000001"
)

// streamEnv is a real HTTP server (streams need one) over a real store
// and audit log, with an admin key (team default) and member keys of
// teams alpha and beta.
type streamEnv struct {
	t     *testing.T
	st    *store.Store
	audit *audit.Log
	url   string
}

func newStreamEnv(t *testing.T, maxStreams int) *streamEnv {
	t.Helper()
	return newStreamEnvConfig(t, Config{MaxEventStreamsPerKey: maxStreams})
}

// newStreamEnvConfig is newStreamEnv with the API's stream bounds of cfg.
func newStreamEnvConfig(t *testing.T, cfg Config) *streamEnv {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []struct{ name, key, team, role string }{
		{"admin", testKey, "", store.RoleAdmin}, {"alpha", alphaStreamKey, "alpha", store.RoleMember}, {"beta", betaStreamKey, "beta", store.RoleMember},
	} {
		if err := st.AddAPIKey(ctx, k.name, k.key, k.team, k.role); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	al := audit.New(st, nil, log)
	cfg.Audit, cfg.EventHeartbeat = al, 100*time.Millisecond
	s := New(cfg, new(sandbox.Manager), st, log)
	hs := httptest.NewServer(s)
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); al.Close(); st.Close() })
	return &streamEnv{t: t, st: st, audit: al, url: hs.URL}
}

// record stores an event caused by a key of team (team "" is a server
// event) and waits until it is stored.
func (e *streamEnv) record(team, kind string) {
	ctx := actor.With(context.Background(), actor.Actor{Team: team})
	e.audit.RecordBy(ctx, "", kind, map[string]any{"team": team})
	e.audit.Sync()
}

type sseEvent struct {
	id, event string
	data      store.Event
	comment   bool
}

// stream is one open event stream, parsed as it arrives.
type stream struct {
	resp   *http.Response
	events chan sseEvent
	cancel context.CancelFunc
}

// open starts GET /v1/events/stream+query with key (and Last-Event-ID
// when lastID is not ""); it returns the answer's status and, for 200,
// the parsed stream.
func (e *streamEnv) open(key, query, lastID string) (int, *stream, []byte) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events/stream"+query, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return resp.StatusCode, nil, body
	}
	s := &stream{resp: resp, events: make(chan sseEvent, 4096), cancel: cancel}
	e.t.Cleanup(s.close)
	go func() {
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		var data string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if data != "" {
					_ = json.Unmarshal([]byte(data), &ev.data)
					s.events <- ev
				}
				ev, data = sseEvent{}, ""
			case strings.HasPrefix(line, ":"):
				s.events <- sseEvent{comment: true}
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				ev.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return resp.StatusCode, s, nil
}

func (s *stream) close() { s.cancel(); s.resp.Body.Close() }

// next returns the next audit event of the stream (skipping heartbeats),
// failing the test if none comes within a generous deadline.
func (s *stream) next(t *testing.T) sseEvent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if !ev.comment {
				return ev
			}
		case <-deadline:
			t.Fatal("no event within 10 s")
		}
	}
}

// quiet reports whether no audit event arrives while the stream sends
// n heartbeats (so events stored before them would have been sent).
func (s *stream) quiet(t *testing.T, n int) (sseEvent, bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for n > 0 {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if !ev.comment {
				return ev, false
			}
			n--
		case <-deadline:
			t.Fatal("no heartbeat within 10 s")
		}
	}
	return sseEvent{}, true
}

// TestEventStreamTeamScope defends against a key reading another team's
// audit events through the live stream: a member of alpha gets alpha's
// events only (never beta's, never server events), in order, as SSE
// with the event id; a member asking for ?team=beta is refused 403
// forbidden; an admin's ?team=all gets every event.
func TestEventStreamTeamScope(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, 0)
	e.record("alpha", "test.one")
	e.record("beta", "test.secret")
	e.record("", "server.thing")
	e.record("alpha", "test.two")

	_, a, _ := e.open(alphaStreamKey, "?after=0", "")
	for _, want := range []string{"test.one", "test.two"} {
		ev := a.next(t)
		if ev.event != "audit" || ev.data.Kind != want || ev.data.Team != "alpha" || ev.id != fmt.Sprint(ev.data.ID) {
			t.Fatalf("alpha's stream gave %+v, want %s of team alpha", ev, want)
		}
	}
	if ev, ok := a.quiet(t, 3); !ok {
		t.Fatalf("alpha's stream gave another team's or a server event: %+v", ev)
	}

	if code, _, body := e.open(alphaStreamKey, "?after=0&team=beta", ""); code != http.StatusForbidden || errCode(body) != CodeForbidden {
		t.Fatalf("a member asking for team beta: %d %s", code, body)
	}

	_, all, _ := e.open(testKey, "?after=0&team=all", "")
	var kinds []string
	for range 4 {
		kinds = append(kinds, all.next(t).data.Kind)
	}
	if got := strings.Join(kinds, ","); got != "test.one,test.secret,server.thing,test.two" {
		t.Fatalf("admin's ?team=all stream: %s", got)
	}
}

// TestEventStreamResumeAndLive: a stream without a cursor starts at the
// newest event (only new ones); a reconnect with Last-Event-ID resumes
// right after that event (the header wins over after=), so an event
// recorded while the client was away is delivered once; a bad cursor is
// 400 invalid_argument.
func TestEventStreamResumeAndLive(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, 0)
	e.record("alpha", "test.old")

	_, s, _ := e.open(alphaStreamKey, "", "")
	if ev, ok := s.quiet(t, 2); !ok {
		t.Fatalf("a stream without a cursor replayed an old event: %+v", ev)
	}
	e.record("alpha", "test.new")
	first := s.next(t)
	if first.data.Kind != "test.new" {
		t.Fatalf("live event: %+v", first)
	}
	s.close()

	e.record("alpha", "test.while_away")
	_, r, _ := e.open(alphaStreamKey, "?after=0", first.id)
	if ev := r.next(t); ev.data.Kind != "test.while_away" {
		t.Fatalf("resume after %s gave %+v, want test.while_away", first.id, ev)
	}

	for _, bad := range []struct{ query, header string }{{"?after=x", ""}, {"?after=-1", ""}, {"", "abc"}} {
		if code, _, body := e.open(alphaStreamKey, bad.query, bad.header); code != http.StatusBadRequest || errCode(body) != CodeInvalidArgument {
			t.Fatalf("cursor %+v: %d %s", bad, code, body)
		}
	}
}

// TestEventStreamBatches: a backlog larger than one read of the store
// (EventStreamBatch) is delivered whole and in order: the stream keeps
// reading while a read comes back full, holding one batch at a time.
func TestEventStreamBatches(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, 0)
	n := 2*EventStreamBatch + 17
	ctx := actor.With(context.Background(), actor.Actor{Team: "alpha"})
	for i := range n {
		e.audit.RecordBy(ctx, "", "test.bulk", map[string]any{"i": i})
	}
	e.audit.Sync()
	_, s, _ := e.open(alphaStreamKey, "?after=0", "")
	var last int64
	for i := range n {
		ev := s.next(t)
		var d struct{ I int }
		_ = json.Unmarshal(ev.data.Data, &d)
		if d.I != i || ev.data.ID <= last {
			t.Fatalf("event %d: got i=%d id=%d after id %d", i, d.I, ev.data.ID, last)
		}
		last = ev.data.ID
	}
}

// TestEventStreamLimitPerKey defends against one key pinning unbounded
// connections and goroutines with event streams: past
// MaxEventStreamsPerKey open streams the key is refused 429
// too_many_streams with Retry-After, another key is not affected, and a
// closed stream frees its place.
func TestEventStreamLimitPerKey(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, 2)
	_, s1, _ := e.open(alphaStreamKey, "", "")
	_, s2, _ := e.open(alphaStreamKey, "", "")
	_ = s2
	code, _, body := e.open(alphaStreamKey, "", "")
	if code != http.StatusTooManyRequests || errCode(body) != CodeTooManyStreams {
		t.Fatalf("third stream of one key: %d %s", code, body)
	}
	if code, _, body := e.open(betaStreamKey, "", ""); code != http.StatusOK {
		t.Fatalf("another key's stream: %d %s", code, body)
	}
	s1.close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, s, _ := e.open(alphaStreamKey, "", "")
		if code == http.StatusOK {
			s.close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed stream did not free its place: %d", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEventStreamLimitPerTeamAndServer defends against followers passing
// the per-key bound: a team that mints many keys is refused past
// MaxEventStreamsPerTeam streams of its keys together, every team past
// MaxEventStreams of the server, each with 429 too_many_streams,
// Retry-After and a message naming the bound (its serve flag); a refused
// open counts against no bound (a closed stream lets exactly one more
// in).
func TestEventStreamLimitPerTeamAndServer(t *testing.T) {
	t.Parallel()
	e := newStreamEnvConfig(t, Config{MaxEventStreamsPerKey: 2, MaxEventStreamsPerTeam: 3, MaxEventStreams: 4})
	const alpha2 = "e2b_alpha0000000000000000000000000000000002"
	if err := e.st.AddAPIKey(context.Background(), "alpha2", alpha2, "alpha", store.RoleMember); err != nil {
		t.Fatal(err)
	}
	refused := func(key, bound string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events/stream", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("stream opened past the bound %s", bound)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusTooManyRequests || errCode(body) != CodeTooManyStreams ||
			resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), bound) {
			t.Fatalf("want 429 too_many_streams, Retry-After 1, naming %s: %d %q %s", bound, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	open := func(key string) *stream {
		t.Helper()
		code, s, body := e.open(key, "", "")
		if code != http.StatusOK {
			t.Fatalf("stream refused: %d %s", code, body)
		}
		return s
	}
	a1 := open(alphaStreamKey)
	open(alphaStreamKey)
	refused(alphaStreamKey, "--max-event-streams-per-key")
	open(alpha2) // the team's third
	refused(alpha2, `team \"alpha\"`)
	refused(alpha2, "--max-event-streams-per-team")
	open(betaStreamKey) // the server's fourth
	refused(betaStreamKey, "(--max-event-streams)")
	refused(testKey, "the server holds 4 event streams")
	// The refusals took no place: one close lets one stream in, not two.
	a1.close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, s, _ := e.open(betaStreamKey, "", "")
		if code == http.StatusOK {
			_ = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed stream did not free its place: %d", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	refused(alpha2, "(--max-event-streams)")
}

// TestEventStreamEndsWhenKeyRevoked defends against a revoked key
// keeping its live view: an open stream re-checks its key at each
// heartbeat and ends once the key is revoked (and a new one is refused
// 401).
func TestEventStreamEndsWhenKeyRevoked(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, 0)
	_, s, _ := e.open(alphaStreamKey, "", "")
	if _, ok := s.quiet(t, 1); !ok {
		t.Fatal("unexpected event")
	}
	if _, _, err := e.st.RevokeAPIKey(context.Background(), store.KeyID(store.HashKey(alphaStreamKey)), time.Now()); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				if code, _, _ := e.open(alphaStreamKey, "", ""); code != http.StatusUnauthorized {
					t.Fatalf("a revoked key's new stream: %d", code)
				}
				return
			}
		case <-deadline:
			t.Fatal("the stream of a revoked key is still open after 10 s")
		}
	}
}

// TestEventStreamHeaders: the stream is text/event-stream and no cache
// may keep it; every /v1 answer is Cache-Control: no-store.
func TestEventStreamHeaders(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, 0)
	_, s, _ := e.open(alphaStreamKey, "", "")
	if ct, cc := s.resp.Header.Get("Content-Type"), s.resp.Header.Get("Cache-Control"); ct != "text/event-stream" || cc != "no-store" {
		t.Fatalf("stream headers: Content-Type %q, Cache-Control %q", ct, cc)
	}
	req, _ := http.NewRequest("GET", e.url+"/v1/whoami", nil)
	req.Header.Set("Authorization", "Bearer "+alphaStreamKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var who struct{ Team, Role, KeyID string }
	_ = json.NewDecoder(resp.Body).Decode(&who)
	if resp.StatusCode != 200 || who.Team != "alpha" || who.Role != "member" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("whoami: %d %+v Cache-Control %q", resp.StatusCode, who, resp.Header.Get("Cache-Control"))
	}
}

// TestEventStreamEndsOnShutdown defends against an open console tab
// holding a graceful shutdown for its whole timeout: an event stream is
// never idle, so http.Server.Shutdown would wait for it; with
// EndEventStreams registered (as internal/server does) Shutdown returns
// before its deadline and the stream ends.
func TestEventStreamEndsOnShutdown(t *testing.T) {
	t.Parallel()
	st, err := store.Open(filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(context.Background(), "alpha", alphaStreamKey, "alpha", store.RoleMember); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	al := audit.New(st, nil, log)
	t.Cleanup(func() { al.Close(); st.Close() })
	s := New(Config{Audit: al}, new(sandbox.Manager), st, log)
	hs := httptest.NewUnstartedServer(s)
	hs.Config.RegisterOnShutdown(s.EndEventStreams)
	hs.Start()
	defer hs.Close()
	e := &streamEnv{t: t, st: st, audit: al, url: hs.URL}
	_, strm, _ := e.open(alphaStreamKey, "", "")
	e.record("alpha", "test.before_shutdown")
	strm.next(t) // the handler is in its loop
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := hs.Config.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with an open event stream: %v", err)
	}
	for range strm.events {
	}
}
