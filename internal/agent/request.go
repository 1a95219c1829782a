package agent

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/corralhq/corral/proto/agentproto"
)

// users returns the account database (read again when the files change).
func (s *Server) users() (*userDB, error) {
	return s.accounts.load(s.cfg.PasswdFile, s.cfg.GroupFile)
}

// rpcUser resolves the user of an RPC: the name in
// "Authorization: Basic base64(<user>:)", else the default user.
func (s *Server) rpcUser(h http.Header) (*user, *userDB, error) {
	name := s.cfg.DefaultUser
	if a := h.Get("Authorization"); a != "" {
		enc, ok := strings.CutPrefix(a, agentproto.UserAuthScheme)
		if !ok {
			return nil, nil, connect.NewError(connect.CodeUnauthenticated, errors.New("invalid authorization header"))
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if err != nil {
			return nil, nil, connect.NewError(connect.CodeUnauthenticated, errors.New("invalid authorization header"))
		}
		name, _, _ = strings.Cut(string(raw), ":")
	}
	db, err := s.users()
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeInternal, err)
	}
	u, err := db.lookup(name)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("invalid username: '%s'", name))
	}
	return u, db, nil
}

// resolvePath turns a request path into an absolute one: empty → home,
// "~" and "~/x" expanded, relative → joined to home. The result is cleaned.
// Paths resolve inside the sandbox's root because the agent runs there.
func resolvePath(p string, u *user) (string, error) {
	if len(p) > maxPathLen {
		return "", fmt.Errorf("path too long (%d > %d bytes)", len(p), maxPathLen)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errors.New("path contains a NUL byte")
	}
	switch {
	case p == "" || p == "~":
		return filepath.Clean(u.Home), nil
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(u.Home, p[2:]), nil
	case filepath.IsAbs(p):
		return filepath.Clean(p), nil
	default:
		return filepath.Join(u.Home, p), nil
	}
}

// rpcPath is resolvePath with invalid_argument errors.
func rpcPath(p string, u *user) (string, error) {
	r, err := resolvePath(p, u)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	return r, nil
}
