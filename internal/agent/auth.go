package agent

import (
	"crypto/subtle"
	"net/http"
	"strconv"
	"time"

	"github.com/corralhq/corral/proto/agentproto"
)

// Access-token errors, worded as envd words them (the e2b tests assert them).
const (
	msgUnauthorized     = "unauthorized access, please provide a valid access token or method signing if supported"
	msgMissingSignature = "missing signature query parameter"
	msgExpiredSignature = "signature is already expired"
	msgInvalidSignature = "invalid signature"
)

// RequireToken wraps next in the agent's access-token check for token
// (authMiddleware), so that an agent stand-in (the fake driver's) enforces
// exactly the rule the real agent does.
func RequireToken(token string, next http.Handler) http.Handler {
	return (&Server{token: token}).authMiddleware(next)
}

// authMiddleware enforces the access token when one is configured:
// X-Access-Token on everything but GET /health; /files also accepts a v1
// URL signature instead of the header.
//
// While the agent waits for its sandbox (a bootstrap token, init.go) only
// GET /health and POST /init pass, and /init checks the bootstrap token
// itself: the bootstrap token, which whoever can read the Pod's spec
// knows, never grants a command, a file or a port.
func (s *Server) authMiddleware(next http.Handler) http.Handler {
	if s.currentToken() == "" && !s.waiting() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == agentproto.InitPath {
			next.ServeHTTP(w, r)
			return
		}
		if s.waiting() {
			writeJSONError(w, http.StatusUnauthorized, msgUnauthorized)
			return
		}
		hdr := r.Header.Get(agentproto.AccessTokenHeader)
		if r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) {
			if hdr != "" {
				if !s.tokenOK(hdr) {
					writeJSONError(w, http.StatusUnauthorized, msgUnauthorized)
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			op := "read"
			if r.Method == http.MethodPost {
				op = "write"
			}
			if msg := s.checkSignature(r, op, time.Now()); msg != "" {
				writeJSONError(w, http.StatusUnauthorized, msg)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if !s.tokenOK(hdr) {
			writeJSONError(w, http.StatusUnauthorized, msgUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) tokenOK(t string) bool {
	return subtle.ConstantTimeCompare([]byte(t), []byte(s.currentToken())) == 1
}

// currentToken is the access token in force.
func (s *Server) currentToken() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.token
}

// checkSignature validates the signature query parameters of a /files
// request; it returns "" when valid, else the 401 message.
func (s *Server) checkSignature(r *http.Request, op string, now time.Time) string {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return msgMissingSignature
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return msgInvalidSignature
		}
		if n < now.Unix() {
			return msgExpiredSignature
		}
		exp = &n
	}
	want := signature(q.Get("path"), op, q.Get("username"), s.currentToken(), exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return msgInvalidSignature
	}
	return ""
}

// signature computes the e2b v1 URL signature (agentproto.Signature).
func signature(path, op, user, token string, exp *int64) string {
	e := ""
	if exp != nil {
		e = strconv.FormatInt(*exp, 10)
	}
	return agentproto.Signature(path, op, user, token, e)
}
