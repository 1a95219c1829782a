package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"

	"github.com/corralhq/corral/internal/actor"
	"github.com/corralhq/corral/internal/store"
)

// MaxAPIKeyLen bounds the API key a request may carry; a longer one is
// refused like a wrong one, without hashing or a lookup.
const MaxAPIKeyLen = 256

// Role is what an identity may do within its team.
type Role string

// Roles of API keys.
const (
	// RoleAdmin may use every route, and may ask for other teams'
	// records (?team=all, ?team=NAME).
	RoleAdmin Role = store.RoleAdmin
	// RoleMember may use its own team's records only, and no
	// server-wide route (keys, quotas, publishing templates).
	RoleMember Role = store.RoleMember
)

// CredentialKind is the kind of credential an Identity was proven by.
type CredentialKind string

// Credential kinds.
const (
	// CredAPIKey is an API key (X-API-Key, or Authorization: Bearer).
	CredAPIKey CredentialKind = "api-key"
	// CredSandbox is a sandbox's envd credential: its access token
	// (X-Access-Token) or a URL signed with it.
	CredSandbox CredentialKind = "sandbox"
)

// Identity is who a request speaks for, established once by the auth
// middleware and read by handlers from the request's context. It names
// the credential (never holds it), so it may be logged.
type Identity struct {
	Kind CredentialKind
	// Team is the team the identity acts for: its key's team, or the
	// team of the sandbox whose credential it holds.
	Team string
	// KeyID identifies an API key: store.KeyID of its hash (the first
	// 16 hex digits of its SHA-256), stable across restarts.
	KeyID string
	// KeyName is the API key's name ("admin").
	KeyName string
	// Role is what the identity may do.
	Role Role
	// SandboxID is the sandbox whose credential a CredSandbox identity
	// holds.
	SandboxID string
}

// principal is the identity's name in per-credential bookkeeping (the
// stream limit): "key:<KeyID>" or "sandbox:<id>".
func (id Identity) principal() string {
	if id.Kind == CredSandbox {
		return "sandbox:" + id.SandboxID
	}
	return "key:" + id.KeyID
}

type identityKey struct{}

func withIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// identityFrom returns the identity the auth middleware attached.
func identityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// apiKey returns the key a request carries: X-API-Key, else a Bearer token.
func apiKey(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	if k, ok := bearerToken(r.Header.Get("Authorization")); ok {
		return k
	}
	return ""
}

// errNoKey: the request carries no API key, or one that no stored key
// matches.
var errNoKey = errors.New("missing or invalid API key")

// identify is the one check of an API key, used by every route family
// and by stripCredentials. It returns errNoKey for a missing, oversized
// or unknown key and another error when the store cannot answer. It
// defends against key guessing by timing: the key is never compared
// byte by byte (see store.LookupAPIKey); and against a revoked key
// being accepted: nothing is cached, every request asks the store.
func (s *Server) identify(ctx context.Context, key string) (Identity, error) {
	if key == "" || len(key) > MaxAPIKeyLen {
		return Identity{}, errNoKey
	}
	k, err := s.store.LookupAPIKey(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return Identity{}, errNoKey
	}
	if err != nil {
		return Identity{}, err
	}
	return Identity{Kind: CredAPIKey, Team: k.Team, KeyID: k.ID, KeyName: k.Name, Role: Role(k.Role)}, nil
}

// routeFamily is how a family of routes answers a refused request: each
// keeps the error shape its clients parse.
type routeFamily struct {
	// unauthenticated answers a missing or wrong key.
	unauthenticated func(w http.ResponseWriter)
	// failed answers a store that could not check the key.
	failed func(s *Server, w http.ResponseWriter, r *http.Request, err error)
	// strictParams refuses query parameters the route does not read
	// (checkParams); without it they are ignored.
	strictParams bool
}

// nativeRoutes are /v1 and /metrics: corral's {"code","message"} with
// the code "unauthenticated".
var nativeRoutes = routeFamily{
	unauthenticated: func(w http.ResponseWriter) {
		writeError(w, http.StatusUnauthorized, CodeUnauthenticated, "missing or invalid API key (X-API-Key or Authorization: Bearer)")
	},
	failed:       func(s *Server, w http.ResponseWriter, r *http.Request, err error) { s.writeErr(w, r, err) },
	strictParams: true,
}

// e2bRoutes are E2B's control-plane routes: E2B's {"code": <status>,
// "message"} (the SDK turns a 401 into its AuthenticationError). Unknown
// query parameters are ignored, as E2B's API ignores them.
var e2bRoutes = routeFamily{
	unauthenticated: func(w http.ResponseWriter) { e2bError(w, http.StatusUnauthorized, "Invalid API key") },
	failed:          func(s *Server, w http.ResponseWriter, r *http.Request, err error) { s.e2bWriteErr(w, r, err) },
}

// authenticate is the one auth middleware of API-key routes: it
// identifies the caller by its API key (identify) and runs h with the
// Identity in the request's context, or refuses in the family's shape.
// It defends against use of the API without a key.
func (s *Server) authenticate(f routeFamily, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.identify(r.Context(), apiKey(r))
		switch {
		case errors.Is(err, errNoKey):
			f.unauthenticated(w)
			return
		case err != nil:
			f.failed(s, w, r, err)
			return
		}
		if err := checkParams(r, f.strictParams); err != nil {
			f.failed(s, w, r, err)
			return
		}
		sc, err := scopeFor(id, r)
		if err != nil {
			f.failed(s, w, r, err)
			return
		}
		ctx := actor.With(withScope(withIdentity(r.Context(), id), sc), actor.Actor{Team: id.Team, KeyID: id.KeyID})
		h(w, r.WithContext(ctx))
	})
}

// admin guards a native server-wide route: only an admin key may call
// it (keys, team quotas, publishing templates). It defends against a
// member key acting beyond its team.
func (s *Server) admin(h http.HandlerFunc) http.Handler {
	return s.auth(func(w http.ResponseWriter, r *http.Request) {
		if id, _ := identityFrom(r.Context()); id.Role != RoleAdmin {
			s.writeErr(w, r, errAdminOnly)
			return
		}
		h(w, r)
	})
}

// auth guards a native route.
func (s *Server) auth(h http.HandlerFunc) http.Handler { return s.authenticate(nativeRoutes, h) }

// e2bAuth guards an E2B control-plane route.
func (s *Server) e2bAuth(h http.HandlerFunc) http.Handler { return s.authenticate(e2bRoutes, h) }

// sameSecret reports whether a presented secret (access token, URL
// signature, volume token) equals the expected one, in time that depends
// on their lengths only: every secret comparison goes through it, so
// none leaks by timing how many leading bytes matched. An empty expected
// secret matches nothing.
func sameSecret(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
