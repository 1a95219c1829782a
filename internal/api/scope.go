package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
)

var (
	// errForbiddenTeam: a member key asked for another team's records.
	errForbiddenTeam = errors.New("only an admin key may ask for another team's records (?team=)")
	// errAdminOnly: a member key called a server-wide route.
	errAdminOnly = errors.New("this route needs an admin key")
)

// AllTeams is the ?team= value with which an admin key asks for every
// team's records.
const AllTeams = store.AllTeams

// scope is which teams' records a request may see: its identity's team,
// or — for an admin key that asks with ?team= — another team or every
// team. Every lookup by id and every list goes through it, so a record of
// another team is absent (404, never 403) and never listed.
type scope struct {
	team string // the one team seen; "" with all
	all  bool
}

// sees reports whether a record owned by team is visible in the scope.
func (sc scope) sees(team string) bool { return sc.all || sc.team == team }

// filter is the team a store list is restricted to; "" means every team.
func (sc scope) filter() string {
	if sc.all {
		return ""
	}
	return sc.team
}

type scopeKey struct{}

// scopeFor is the scope of a request by id: its own team, or what an
// admin asked for with ?team=. A member asking for another team gets
// errForbiddenTeam (whether that team exists is not said).
func scopeFor(id Identity, r *http.Request) (scope, error) {
	asked := paramsOf(r).str("team")
	switch {
	case asked == "" || asked == id.Team:
		return scope{team: id.Team}, nil
	case id.Role != RoleAdmin || id.Kind != CredAPIKey:
		return scope{}, errForbiddenTeam
	case asked == AllTeams:
		return scope{all: true}, nil
	default:
		return scope{team: asked}, nil
	}
}

func withScope(ctx context.Context, sc scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, sc)
}

// scopeFrom returns the scope the auth middleware attached. A request
// without one (a route that forgot authenticate) sees nothing.
func scopeFrom(ctx context.Context) scope {
	sc, ok := ctx.Value(scopeKey{}).(scope)
	if !ok {
		return scope{team: "\x00none"}
	}
	return sc
}

// objectKind is what the {id} of a route names.
type objectKind string

// Kinds of objects a route's {id} names.
const (
	sandboxObject  objectKind = "sandbox"
	snapshotObject objectKind = "snapshot"
	taskObject     objectKind = "task"
	// e2bTemplateObject is a snapshot as E2B names it (a template id).
	e2bTemplateObject objectKind = "template"
)

// errOutOfScope stands for an object the caller may not see; it is
// answered exactly as an id that does not exist.
var errOutOfScope = errors.New("not in scope")

// ownerOf returns the team that owns object id of kind, or an error
// wrapping store.ErrNotFound for an id that does not exist.
func (s *Server) ownerOf(ctx context.Context, kind objectKind, id string) (string, error) {
	switch kind {
	case sandboxObject:
		team, err := s.mgr.Team(ctx, id)
		if errors.Is(err, sandbox.ErrNotFound) {
			return "", store.ErrNotFound
		}
		return team, err
	case snapshotObject, e2bTemplateObject:
		sn, err := s.store.GetSnapshot(ctx, id)
		if err != nil {
			return "", err
		}
		return sn.Team, nil
	case taskObject:
		t, err := s.store.GetTask(ctx, id)
		if err != nil {
			return "", err
		}
		return t.Team, nil
	}
	return "", fmt.Errorf("unknown object kind %q", kind)
}

// visible checks that object id of kind exists and is in the request's
// scope: errOutOfScope for another team's object and for one that does
// not exist alike, so that the answer never tells them apart.
func (s *Server) visible(r *http.Request, kind objectKind, id string) error {
	team, err := s.ownerOf(r.Context(), kind, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !scopeFrom(r.Context()).sees(team)) {
		return errOutOfScope
	}
	return err
}

// scoped guards a native route whose {id} names an object of kind: the
// object must be the caller's team's (or in an admin's ?team= scope),
// else the answer is 404 not_found "<kind> not found", byte for byte the
// answer for an id that never existed. It defends against one team
// reading, changing or probing another team's objects by id.
func (s *Server) scoped(kind objectKind, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch err := s.visible(r, kind, r.PathValue("id")); {
		case errors.Is(err, errOutOfScope):
			writeError(w, http.StatusNotFound, CodeNotFound, string(kind)+" not found")
		case err != nil:
			s.writeErr(w, r, err)
		default:
			h(w, r)
		}
	}
}

// e2bScoped is scoped for an E2B route, with the E2B handlers' 404
// bodies ({"code":404,"message":"sandbox \"<id>\" not found"}, or
// "template <id> not found").
func (s *Server) e2bScoped(kind objectKind, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		switch err := s.visible(r, kind, id); {
		case errors.Is(err, errOutOfScope):
			msg := fmt.Sprintf("sandbox %q not found", id)
			if kind != sandboxObject {
				msg = string(kind) + " " + id + " not found"
			}
			e2bError(w, http.StatusNotFound, msg)
		case err != nil:
			s.e2bWriteErr(w, r, err)
		default:
			h(w, r)
		}
	}
}

// templateVisible checks that template ref exists and that the caller
// may see it: published, its team's own, or in an admin's ?team= scope.
// An invisible one is registry.ErrNotFound, as if it did not exist. With
// change (make current, delete), a published template needs an admin key.
func (s *Server) templateVisible(r *http.Request, ref string, change bool) error {
	name, _ := registry.SplitRef(ref)
	owner, exists, err := s.store.TemplateOwner(r.Context(), name)
	if err != nil {
		return err
	}
	if !exists || (owner != "" && !scopeFrom(r.Context()).sees(owner)) {
		return fmt.Errorf("template %q: %w", ref, registry.ErrNotFound)
	}
	if id, _ := identityFrom(r.Context()); change && owner == "" && id.Role != RoleAdmin {
		return errAdminOnly
	}
	return nil
}

// templateScoped guards a native route whose {ref} names a template (see
// templateVisible); it defends against one team using, changing or
// probing another team's private templates.
func (s *Server) templateScoped(change bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.templateVisible(r, r.PathValue("ref"), change); err != nil {
			s.templateErr(w, r, err)
			return
		}
		h(w, r)
	}
}

// newTemplateTeam is the team a template made by the request belongs to:
// the caller's, or "" (published) when an admin asks with ?publish=true.
func newTemplateTeam(r *http.Request) (string, error) {
	id, _ := identityFrom(r.Context())
	p := paramsOf(r)
	publish := p.boolean("publish")
	if err := p.err(); err != nil {
		return "", err
	}
	if !publish {
		return id.Team, nil
	}
	if id.Role != RoleAdmin {
		return "", errAdminOnly
	}
	return "", nil
}

// callerTeam is the team a record made by the request belongs to: the
// caller's own, whatever ?team= scope an admin asked for.
func callerTeam(r *http.Request) string {
	id, _ := identityFrom(r.Context())
	return id.Team
}
