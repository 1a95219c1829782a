package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// Event stream bounds (GET /v1/events/stream).
const (
	// DefaultMaxEventStreamsPerKey is how many event streams one API key
	// may hold open at once (Config.MaxEventStreamsPerKey).
	DefaultMaxEventStreamsPerKey = 8
	// DefaultMaxEventStreamsPerTeam is how many event streams the keys
	// of one team may hold open at once together
	// (Config.MaxEventStreamsPerTeam).
	DefaultMaxEventStreamsPerTeam = 32
	// DefaultMaxEventStreams is how many event streams the server holds
	// open at once in all (Config.MaxEventStreams).
	DefaultMaxEventStreams = 256
	// DefaultEventHeartbeat is how often an idle event stream sends a
	// comment line and checks that its key is still valid
	// (Config.EventHeartbeat).
	DefaultEventHeartbeat = 15 * time.Second
	// EventStreamBatch is the most events one read of the store takes
	// for one stream: what a connection holds in memory at once.
	EventStreamBatch = 256
	// eventStreamRetryMS is the reconnection delay the stream asks a
	// client for (the SSE retry field).
	eventStreamRetryMS = 2000
)

// EndEventStreams ends every open event stream (and any opened later),
// for a graceful shutdown: register it with http.Server.RegisterOnShutdown.
// It defends against an open console tab holding a shutdown for its whole
// timeout (a stream is never idle, so Shutdown would wait for it).
func (s *Server) EndEventStreams() { s.endingOnce.Do(func() { close(s.ending) }) }

// whoami serves GET /v1/whoami: the caller's team, role and key id and
// name (never the key), for a client (the console) to show who it is
// signed in as.
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	id, _ := identityFrom(r.Context())
	writeJSON(w, http.StatusOK, map[string]any{"team": id.Team, "role": id.Role, "key_id": id.KeyID, "key_name": id.KeyName})
}

// eventStream serves GET /v1/events/stream?sandbox=&task=&kind=&after=:
// the audit log as server-sent events, scoped like GET /v1/audit (a key
// sees its team's events; server events only an admin's ?team=all).
// Each event is `id: <event id>`, `event: audit`, `data: <the event as
// GET /v1/audit gives it>`. It starts after the event of the
// Last-Event-ID header (a reconnecting EventSource), else of `after=`,
// else at the newest event (only new events). Idle, it sends a comment
// every Config.EventHeartbeat and then checks that the key still exists
// (a revoked key's stream ends).
//
// It defends against a follower exhausting the server: a key holds at
// most Config.MaxEventStreamsPerKey streams, a team's keys together
// Config.MaxEventStreamsPerTeam, the server Config.MaxEventStreams (429
// too_many_streams, eventStreamLimits), a
// stream reads at most EventStreamBatch events from the store at a time
// and holds nothing else (the cursor is the event id, so a slow client
// lags behind in the store, never in the server's memory), and a client
// that stops reading is cut by the stall timeout (progressDeadlines).
func (s *Server) eventStream(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	f := store.EventFilter{Team: scopeFrom(r.Context()).filter(), SandboxID: p.str("sandbox"), TaskID: p.str("task"), Kind: p.str("kind"), Limit: EventStreamBatch}
	after, given := p.integer("after", 0, 0, math.MaxInt64)
	if h := r.Header.Get("Last-Event-ID"); h != "" {
		// A reconnecting EventSource's cursor wins over the URL's.
		v, err := parseInteger(h, 0, math.MaxInt64)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "header Last-Event-ID: "+err.Error())
			return
		}
		after, given = v, true
	}
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if given {
		f.AfterID = after
	} else {
		last, err := s.store.LastEventID(r.Context())
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		f.AfterID = last
	}
	id, _ := identityFrom(r.Context())
	release, refusal := s.eventStreams.acquire(id)
	if refusal != "" {
		w.Header().Set("Retry-After", streamRetryAfter)
		writeJSON(w, http.StatusTooManyRequests, apiError{Code: CodeTooManyStreams, Message: refusal})
		return
	}
	defer release()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, "retry: %d\n\n", eventStreamRetryMS); err != nil || rc.Flush() != nil {
		return
	}
	heartbeat := time.NewTicker(s.cfg.EventHeartbeat)
	defer heartbeat.Stop()
	var buf bytes.Buffer
	for {
		// Take the notification before reading, so an event stored after
		// the read wakes the wait below.
		var written <-chan struct{}
		if s.cfg.Audit != nil {
			written = s.cfg.Audit.Written()
		}
		evs, err := s.store.ListEvents(r.Context(), f)
		if err != nil {
			if r.Context().Err() == nil {
				s.log.Warn("event stream: read events", "err", err)
			}
			return
		}
		if len(evs) > 0 {
			buf.Reset()
			for _, ev := range evs {
				b, _ := json.Marshal(ev)
				// JSON has no raw line breaks, so one data line holds it.
				fmt.Fprintf(&buf, "id: %d\nevent: audit\ndata: %s\n\n", ev.ID, b)
			}
			f.AfterID = evs[len(evs)-1].ID
			if _, err := w.Write(buf.Bytes()); err != nil || rc.Flush() != nil {
				return
			}
			if len(evs) == f.Limit {
				continue // more are stored already
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.ending:
			return
		case <-written:
		case <-heartbeat.C:
			if _, err := s.identify(r.Context(), apiKey(r)); err != nil {
				if !errors.Is(err, errNoKey) && r.Context().Err() == nil {
					s.log.Warn("event stream: check key", "err", err)
				}
				return
			}
			if _, err := w.Write([]byte(": heartbeat\n\n")); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// eventStreamLimits bounds the open event streams per API key, per team
// and in all. It defends against followers pinning unbounded
// connections, goroutines and store reads: one key opening many
// streams, a team minting many keys to pass the per-key bound, and many
// teams together exhausting the server.
type eventStreamLimits struct {
	perKey, perTeam, total *streamLimit
}

func newEventStreamLimits(perKey, perTeam, total int) *eventStreamLimits {
	return &eventStreamLimits{perKey: newStreamLimit(perKey), perTeam: newStreamLimit(perTeam), total: newStreamLimit(total)}
}

// acquire counts one more stream of id against every bound, or returns
// the refusal's message naming the bound that is full (and counts
// nothing). The release function gives the stream back (once).
func (l *eventStreamLimits) acquire(id Identity) (release func(), refusal string) {
	var taken []func()
	undo := func() {
		for _, r := range taken {
			r()
		}
	}
	for _, b := range []struct {
		lim        *streamLimit
		key, whose string
		flag       string
	}{
		{l.perKey, id.principal(), "this API key holds", "--max-event-streams-per-key"},
		{l.perTeam, "team:" + id.Team, "the keys of team " + strconv.Quote(id.Team) + " hold", "--max-event-streams-per-team"},
		{l.total, "server", "the server holds", "--max-event-streams"},
	} {
		r, ok := b.lim.acquire(b.key)
		if !ok {
			undo()
			return nil, fmt.Sprintf("%s %d event streams open, the most it allows (%s); close one or retry later", b.whose, b.lim.max, b.flag)
		}
		taken = append(taken, r)
	}
	return undo, ""
}

// auditChange records the event of a change to who may do what (API
// keys, secrets, team quotas, published templates) and returns once it is
// stored. Such an event is answered only after its commit: a control plane
// that crashes right after the answer still has it, and another replica
// reading the shared store sees it from the answer on (other events are
// batched: a few milliseconds and one commit later).
func (s *Server) auditChange(ctx context.Context, kind string, data any) {
	if s.cfg.Audit == nil {
		return
	}
	s.cfg.Audit.RecordBy(ctx, "", kind, data)
	s.cfg.Audit.Sync()
}
