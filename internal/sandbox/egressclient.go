package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/store"
)

// secretStore reads a team's registered secrets (*store.Store).
type secretStore interface {
	GetSecret(ctx context.Context, team, name string) (*store.Secret, error)
}

// lookupSecrets resolves names in team: the one rule of which secrets a
// sandbox may be given, for the Manager (at create, for the local
// gateway) and for the cluster egress proxy (EgressClient). Another
// team's secret of a name is refused exactly as a missing one.
func lookupSecrets(ctx context.Context, st secretStore, team string, names []string) ([]egress.Secret, error) {
	if len(names) > MaxSecretsPerSandbox {
		return nil, invalid("at most %d secrets per sandbox", MaxSecretsPerSandbox)
	}
	var out []egress.Secret
	for _, n := range names {
		if err := egress.ValidSecretName(n); err != nil {
			return nil, invalid("secret %q: %v", n, err)
		}
		s, err := st.GetSecret(ctx, team, n)
		if errors.Is(err, store.ErrNotFound) {
			return nil, invalid("secret %q is not registered (corral secret set)", n)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, egress.Secret{Name: s.Name, Hosts: s.Hosts, Header: s.Header, Value: s.Value, AllowHTTP: s.AllowHTTP})
	}
	return out, nil
}

// EgressClient is what an egress proxy serving sandbox rec enforces: its
// policy (mode and allow list as stored), its team's secrets it was
// created with, and limits. It is the cluster egress proxy's view of a
// sandbox (internal/egressd), built from the store by the same rules the
// Manager gives the local gateway, so that the two proxies cannot
// disagree. A sandbox that is not running gets an error: a record that
// ended must not lend its policy or secrets to whoever sends from its
// old address.
func EgressClient(ctx context.Context, st secretStore, rec *store.Sandbox, limits egress.Limits) (egress.Client, error) {
	if rec.State != store.StateRunning {
		return egress.Client{}, fmt.Errorf("sandbox %s is %s", rec.ID, rec.State)
	}
	pol, err := parsePolicy(rec.Network, rec.Egress.Allow)
	if err != nil {
		return egress.Client{}, fmt.Errorf("sandbox %s: stored %w", rec.ID, err)
	}
	c := egress.Client{ID: rec.ID, Policy: pol, Limits: limits}
	if pol.Mode == egress.ModeNone {
		return c, nil
	}
	if c.Secrets, err = lookupSecrets(ctx, st, rec.Team, rec.Egress.Secrets); err != nil {
		return egress.Client{}, fmt.Errorf("sandbox %s: secrets: %w", rec.ID, err)
	}
	return c, nil
}
