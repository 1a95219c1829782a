package agent

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"

	"github.com/corralhq/corral/proto/agentproto"
)

// bootstrapEnv names the variable Main takes the bootstrap token from.
const bootstrapEnv = agentproto.BootstrapTokenEnv

// Bounds of POST /init.
const (
	maxInitBody = 1 << 20
	maxInitEnv  = 1000
	minTokenLen = 16
)

// waiting reports whether the agent still waits for POST /init.
func (s *Server) waiting() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.bootstrap != ""
}

// sandboxEnv is the sandbox-global environment (KEY=VALUE).
func (s *Server) sandboxEnv() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.env
}

// handleInit is POST /init: with the bootstrap token, once, it sets the
// sandbox's access token and environment.
//
// It defends against a warm Pod handed to the wrong caller: the bootstrap
// token is in the Pod's spec, so whoever may read Pods knows it; it opens
// nothing but this call, the call is accepted once (a second one, with
// any token, is refused with 409 and changes nothing), and the access
// token it sets must differ from the bootstrap token. A sandbox's code
// runs only after the call, under the new token.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bootstrap == "" {
		writeJSONError(w, http.StatusConflict, "agent already initialised")
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(agentproto.AccessTokenHeader)), []byte(s.bootstrap)) != 1 {
		writeJSONError(w, http.StatusUnauthorized, msgUnauthorized)
		return
	}
	var req agentproto.InitRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxInitBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "bad init body: "+err.Error())
		return
	}
	if err := checkInit(req, s.bootstrap); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.TrustCA != "" {
		skipped, err := installCA(s.cfg.CARoot, []byte(req.TrustCA))
		if err != nil {
			writeJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
		if skipped {
			slog.Warn("agent: read-only root file system: the egress CA is not installed (the template must trust it)")
		}
	}
	keys := make([]string, 0, len(req.EnvVars))
	for k := range req.EnvVars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := append([]string(nil), s.env...)
	for _, k := range keys {
		env = append(env, k+"="+req.EnvVars[k])
	}
	s.env, s.token, s.bootstrap = env, req.AccessToken, ""
	w.WriteHeader(http.StatusNoContent)
}

// checkInit validates an init request.
func checkInit(req agentproto.InitRequest, bootstrap string) error {
	if len(req.AccessToken) < minTokenLen {
		return fmt.Errorf("accessToken must have at least %d characters", minTokenLen)
	}
	if req.AccessToken == bootstrap {
		return fmt.Errorf("accessToken must differ from the bootstrap token")
	}
	if len(req.EnvVars) > maxInitEnv {
		return fmt.Errorf("at most %d envVars", maxInitEnv)
	}
	if req.TrustCA != "" {
		if err := checkTrustCA(req.TrustCA); err != nil {
			return err
		}
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("bad envVars name %q", k)
		}
		if strings.ContainsRune(req.EnvVars[k], 0) {
			return fmt.Errorf("envVars %s holds a NUL byte", k)
		}
	}
	return nil
}

// listenTCP listens on cfg.Listen. It refuses an agent on TCP that no
// token guards: anyone who can reach the Pod IP could run commands.
func listenTCP(cfg Config) (net.Listener, error) {
	if cfg.TokenFile == "" && cfg.BootstrapToken == "" {
		return nil, fmt.Errorf("agent: refusing to listen on TCP %s without an access token (--token-file or %s)", cfg.Listen, bootstrapEnv)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("agent: listen: %w", err)
	}
	return ln, nil
}
