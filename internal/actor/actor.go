// Package actor carries who caused an action — the team and the id of the
// API key of a request — through a context, from the API's auth check to
// the audit log, so that every event records the key that caused it
// without each layer passing it by hand. It holds ids, never credentials.
package actor

import "context"

// Actor is the caller an action is done for.
type Actor struct {
	// Team is the team the caller acts for.
	Team string
	// KeyID identifies the API key (never the key itself); "" when the
	// caller holds no API key (a sandbox's own credential).
	KeyID string
}

type ctxKey struct{}

// With returns ctx carrying a.
func With(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, ctxKey{}, a)
}

// From returns the actor ctx carries, or the zero Actor (no key, no
// team: a timer, the server, the sandbox itself).
func From(ctx context.Context) Actor {
	if ctx == nil {
		return Actor{}
	}
	a, _ := ctx.Value(ctxKey{}).(Actor)
	return a
}
