package api

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/agentclient"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/proto/agentproto"
)

type portKey struct{}

type portTarget struct {
	id   string
	port int
}

// newPortProxy returns the reverse proxy for <port>-<id>.<domain> host
// names: HTTP (and upgraded connections such as WebSockets) to a server
// listening on 127.0.0.1:port inside the sandbox, through a tunnel over
// the agent's socket. Like E2B's default, sandbox ports are public to
// whoever can reach corral's listener.
func newPortProxy(mgr *sandbox.Manager, log *slog.Logger) http.Handler {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			t, _ := ctx.Value(portKey{}).(portTarget)
			return mgr.DialPort(ctx, t.id, t.port)
		},
		DisableKeepAlives: true, // one tunnel per request; the target may differ
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t, _ := pr.In.Context().Value(portKey{}).(portTarget)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "127.0.0.1:" + strconv.Itoa(t.port)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t, _ := r.Context().Value(portKey{}).(portTarget)
			var pe *agentclient.PortError
			if errors.As(err, &pe) {
				writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.id,
					"message": "nothing listens on port " + strconv.Itoa(t.port) + " in the sandbox", "code": 502, "port": t.port})
				return
			}
			log.Warn("sandbox port proxy", "sandbox", t.id, "port", t.port, "err", err)
			e2bNotFound(w, t.id)
		},
	}
}

// TrafficTokenHeader carries a private sandbox's traffic token on a
// request to one of its ports (the header the E2B SDK sends).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// CodeTrafficToken is the code of a request to a private sandbox's port
// without its traffic token (or with a wrong one).
const CodeTrafficToken = "traffic_token_required"

// sandboxPort serves a request for port of sandbox id. A private
// sandbox's ports answer only a request that carries its traffic token
// (compared in constant time): it defends against anyone who can reach
// corral's listener reaching an app a sandbox serves when its creator
// asked for private ports. The refusal is audited (without the token)
// and the token never reaches the app.
func (s *Server) sandboxPort(w http.ResponseWriter, r *http.Request, id string, port int) {
	token, ok := s.mgr.TrafficToken(id)
	if !ok {
		e2bNotFound(w, id)
		return
	}
	if token != "" && !sameSecret(r.Header.Get(TrafficTokenHeader), token) {
		if s.cfg.Audit != nil {
			s.cfg.Audit.Record(id, "port.refused", map[string]any{"port": port, "code": CodeTrafficToken,
				"token_given": r.Header.Get(TrafficTokenHeader) != ""})
		}
		writeJSON(w, http.StatusForbidden, map[string]any{"sandboxId": id, "code": CodeTrafficToken,
			"message": "the ports of sandbox " + id + " are private: send its traffic access token in the " + TrafficTokenHeader + " header"})
		return
	}
	if port == InterpreterPort {
		if r.Method == http.MethodPost && r.URL.Path == "/execute" {
			s.e2bExecute(w, r, id) // a code run: a tool call with brakes and audit
			return
		}
		s.awaitInterpreter(r.Context(), id) // the contexts routes, right after create
	}
	ctx := context.WithValue(r.Context(), portKey{}, portTarget{id: id, port: port})
	r2 := r.Clone(ctx)
	s.stripCredentials(r2, false)
	r2.Header.Del(TrafficTokenHeader)
	_ = http.NewResponseController(w).EnableFullDuplex() // see newAgentProxy
	s.ports.ServeHTTP(w, r2)
}

// stripCredentials removes corral's own credentials from a request about
// to leave corral for a sandbox, whose code must never learn the caller's
// API key: X-API-Key and X-Access-Token (the headers of corral's and
// envd's credentials) always, and an Authorization header with a Bearer
// token that is, or has the shape of, a corral API key ("e2b_" and 40 hex
// digits). With anyBearer (the agent, which reads only Basic
// Authorization for the user) every Bearer token goes. Other
// Authorization values, an app's own, pass.
func (s *Server) stripCredentials(r *http.Request, anyBearer bool) {
	r.Header.Del("X-API-Key")
	r.Header.Del(agentproto.AccessTokenHeader)
	for _, a := range r.Header.Values("Authorization") {
		tok, ok := bearerToken(a)
		if !ok {
			continue
		}
		if anyBearer || apiKeyShape.MatchString(tok) {
			r.Header.Del("Authorization")
			return
		}
		if _, err := s.identify(r.Context(), tok); !errors.Is(err, errNoKey) {
			// On a failed check the header goes too: better an app
			// misses its header than a key leaks.
			r.Header.Del("Authorization")
			return
		}
	}
}

// apiKeyShape matches the keys corral issues (E2B's shape).
var apiKeyShape = regexp.MustCompile(`^e2b_[0-9a-fA-F]{40}$`)

// bearerToken returns the token of a "Bearer TOKEN" Authorization value.
func bearerToken(a string) (string, bool) {
	if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:]), true
	}
	return "", false
}
