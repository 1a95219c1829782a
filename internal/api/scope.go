package api

import (
	"context"
	"errors"
	"net/http"
)

var (
	// errForbiddenTeam: a member key asked for another team's records.
	errForbiddenTeam = errors.New("only an admin key may ask for another team's records (?team=)")
	// errAdminOnly: a member key called a server-wide route.
	errAdminOnly = errors.New("this route needs an admin key")
)

// AllTeams is the ?team= value with which an admin key asks for every
// team's records.
const AllTeams = "all"

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
	asked := r.URL.Query().Get("team")
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
