package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/gateway"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/store"
)

// Network limits.
const (
	// MaxSecretsPerSandbox bounds the secrets one sandbox may use.
	MaxSecretsPerSandbox = 16
)

// ErrNetworkUnavailable: a network was asked for but this server runs
// without one (it could not set up its gateway).
var ErrNetworkUnavailable = errors.New("sandbox networking is not available on this server")

// ErrShuttingDown: the server is shutting down and starts no sandbox.
var ErrShuttingDown = errors.New("the server is shutting down")

// NetworkRequest is a sandbox's network policy as a caller gives it.
type NetworkRequest struct {
	// Mode is "none" (default), "allow" or "all-public".
	Mode string `json:"mode"`
	// Allow lists domain patterns and CIDR:port rules (mode "allow").
	Allow []string `json:"allow,omitempty"`
}

// gvisorNoNetwork explains why gVisor sandboxes have no network under a
// legacy runsc (Config.GVisorLegacy).
const gvisorNoNetwork = "gVisor sandboxes have network none on this server: it runs Debian's runsc (2022), which cannot use a prepared network namespace on current kernels (make runsc builds the pinned one); use runtime runc for egress"

// parsePolicy checks mode and allow.
func parsePolicy(mode string, allow []string) (egress.Policy, error) {
	if mode == "" {
		mode = string(egress.ModeNone)
	}
	pol, err := egress.ParsePolicy(mode, allow)
	if err != nil {
		return pol, invalid("network: %v", err)
	}
	return pol, nil
}

// resolveSecrets looks the named secrets up in team (a sandbox's own
// team); unknown names are invalid. Another team's secret of that name
// is refused exactly as a missing one: it defends against a sandbox
// being given (and the egress proxy injecting into it) another team's
// credential, and against probing which names another team registered.
func (m *Manager) resolveSecrets(ctx context.Context, team string, names []string) ([]egress.Secret, error) {
	return lookupSecrets(ctx, m.store, team, names)
}

// prepareNetwork gives a sandbox about to start its resolv.conf and, when
// its policy opens egress, reserved addresses, the proxy variables, the
// secrets' placeholders and (with secrets) the egress CA. A runc sandbox
// gets its veth pair right after it starts (activateNetwork), in the
// namespace runc made: a namespace made beforehand would belong to the
// host's user namespace, and the sandbox (in its own) could then not
// mount its sysfs. A gVisor sandbox gets a namespace with its veth pair
// now (rc.NetNS), since gVisor's network stack takes its interfaces over
// when it starts; its sysfs is gVisor's own.
func (m *Manager) prepareNetwork(rec *store.Sandbox, rc *runtime.Config, pol egress.Policy, secrets []egress.Secret) error {
	gw := m.cfg.Gateway
	if gw == nil {
		if pol.Mode == egress.ModeNone {
			return nil
		}
		if m.cfg.RemoteProxyEnv == nil {
			return ErrNetworkUnavailable
		}
		rc.Egress = true
		for k, v := range m.cfg.RemoteProxyEnv {
			if _, set := rc.Env[k]; !set {
				rc.Env[k] = v
			}
		}
		if len(secrets) > 0 && len(m.cfg.RemoteCA) > 0 {
			rc.TrustCA = m.cfg.RemoteCA
			for k, v := range gateway.TrustEnv() {
				rc.Env[k] = v
			}
		}
		for _, s := range secrets {
			rc.Env[s.Placeholder()] = s.Placeholder()
		}
		return nil
	}
	rc.Files = append(rc.Files, runtime.FileBind{Source: gw.ResolvConf(), Destination: "/etc/resolv.conf"})
	if pol.Mode == egress.ModeNone {
		return nil
	}
	if len(secrets) > 0 {
		files, env, err := gw.TrustFiles(rc.RootFS)
		if err != nil {
			return fmt.Errorf("egress CA for %s: %w", rec.ID, err)
		}
		rc.Files = append(rc.Files, files...)
		for k, v := range env {
			rc.Env[k] = v
		}
	}
	// Reserve the addresses now so that the proxy variables can name the
	// gateway; the veth pair follows once the sandbox runs.
	reserve := gw.Reserve
	if rc.Runtime == runtime.GVisor {
		reserve = gw.Create
	}
	l, err := reserve(rec.ID)
	if err != nil {
		return fmt.Errorf("network for %s: %w", rec.ID, err)
	}
	rc.NetNS = l.NSPath
	for k, v := range gateway.ProxyEnv(l) {
		if _, set := rc.Env[k]; !set {
			rc.Env[k] = v
		}
	}
	for _, s := range secrets {
		rc.Env[s.Placeholder()] = s.Placeholder()
	}
	return nil
}

// activateNetwork gives a just started runc sandbox its reserved veth
// pair (a gVisor one has it already) and installs the sandbox's policy
// in the gateway.
func (m *Manager) activateNetwork(id string, pol egress.Policy, secrets []egress.Secret) error {
	if m.cfg.Gateway == nil || pol.Mode == egress.ModeNone {
		return nil
	}
	if m.cfg.Gateway.Reserved(id) {
		nsPath, err := m.driver.NetNS(context.Background(), id)
		if err != nil {
			return err
		}
		if _, err := m.cfg.Gateway.Attach(id, nsPath); err != nil {
			return err
		}
	}
	return m.cfg.Gateway.Set(id, egress.Client{ID: id, Policy: pol, Limits: m.cfg.EgressLimits, Secrets: secrets})
}

// teardownNetwork removes the sandbox's veth pair, if any.
func (m *Manager) teardownNetwork(id string) {
	if m.cfg.Gateway == nil {
		return
	}
	if err := m.cfg.Gateway.Remove(id); err != nil {
		m.log.Error("remove sandbox network", "id", id, "err", err)
	}
}

// SetNetwork changes a live sandbox's network policy. It takes effect on
// the sandbox's next connection or DNS query; open connections keep going
// until they end, except when the mode becomes "none" (the veth pair is
// removed, which cuts them). A runc sandbox created without a network gets
// one; a gVisor sandbox's network is fixed when it starts, so it cannot
// gain one later (ErrConflict). Secrets are fixed at create.
func (m *Manager) SetNetwork(ctx context.Context, id string, req NetworkRequest) (*store.Sandbox, error) {
	pol, err := parsePolicy(req.Mode, req.Allow)
	if err != nil {
		return nil, err
	}
	// The operation lock keeps a persisted pause or its resume (which
	// tear down and set up the network) from interleaving with this.
	ls, unlock, err := m.lockOp(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	m.mu.Lock()
	rec, stopped := ls.rec, ls.stopped
	m.mu.Unlock()
	if pol.Mode != egress.ModeNone && rec.Runtime == string(runtime.GVisor) && m.cfg.GVisorLegacy {
		return nil, invalid(gvisorNoNetwork)
	}
	m.netMu.Lock()
	defer m.netMu.Unlock()
	gw := m.cfg.Gateway
	if gw == nil && pol.Mode != egress.ModeNone && m.cfg.RemoteProxyEnv == nil {
		return nil, ErrNetworkUnavailable
	}
	secrets, err := m.resolveSecrets(ctx, rec.Team, rec.Egress.Secrets)
	if err != nil {
		return nil, err
	}
	// With a remote proxy the driver admits the sandbox to it at the
	// network level (the kube driver's Pod label): shut out before the
	// record says none, admitted before it says otherwise, so that a
	// failure here changes nothing the proxy reads.
	if es, ok := m.driver.(runtime.EgressSwitch); ok && gw == nil && m.cfg.RemoteProxyEnv != nil && !stopped {
		if err := es.SetEgress(ctx, id, pol.Mode != egress.ModeNone); err != nil {
			return nil, m.goneOr(ls, fmt.Errorf("network of %s: %w", id, err))
		}
	}
	// A persisted sandbox has no processes and no network: the new
	// policy is recorded and applied when it is resumed.
	if gw != nil && !stopped {
		_, has := gw.Link(id)
		switch {
		case pol.Mode == egress.ModeNone:
			if has {
				m.teardownNetwork(id)
			}
		case !has:
			nsPath, err := m.driver.NetNS(ctx, id)
			if err != nil {
				return nil, m.goneOr(ls, &ConflictError{Msg: "cannot add a network to this sandbox: " + err.Error() + "; create it with a network policy instead"})
			}
			if _, err := gw.Attach(id, nsPath); err != nil {
				return nil, m.goneOr(ls, fmt.Errorf("attach network to %s: %w", id, err))
			}
			fallthrough
		default:
			if err := m.activateNetwork(id, pol, secrets); err != nil {
				return nil, m.goneOr(ls, err)
			}
		}
	}
	if gw != nil && m.endingOrGone(ls) {
		// Killed meanwhile: what was attached above must not outlive it.
		m.teardownNetwork(id)
		return nil, ErrNotFound
	}
	eg := store.Egress{Allow: slices.Clone(req.Allow), Secrets: rec.Egress.Secrets}
	if pol.Mode != egress.ModeAllow {
		eg.Allow = nil
	}
	if err := m.store.SetNetwork(ctx, id, string(pol.Mode), eg); err != nil {
		return nil, err
	}
	m.mu.Lock()
	rec.Network, rec.Egress = string(pol.Mode), eg
	m.mu.Unlock()
	m.auditBy(ctx, id, "network.changed", map[string]any{"mode": pol.Mode, "allow": eg.Allow})
	m.log.Info("sandbox network changed", "id", id, "mode", pol.Mode, "allow", len(eg.Allow))
	return m.store.GetSandbox(ctx, id)
}

// restoreNetworks is part of Reconcile: veth pairs a crashed server left
// are adopted; live sandboxes that lost theirs (a clean shutdown removes
// them) get a new one when the runtime allows it.
func (m *Manager) restoreNetworks(ctx context.Context) {
	gw := m.cfg.Gateway
	if gw == nil {
		return
	}
	m.mu.Lock()
	live := map[string]*store.Sandbox{}
	for id, ls := range m.live {
		live[id] = ls.rec
	}
	m.mu.Unlock()
	if _, err := gw.Adopt(func(id string) bool { return live[id] != nil && live[id].Network != string(egress.ModeNone) }); err != nil {
		m.log.Error("adopt sandbox networks", "err", err)
	}
	for id, rec := range live {
		if rec.Network == string(egress.ModeNone) || rec.Network == "" {
			continue
		}
		pol, err := parsePolicy(rec.Network, rec.Egress.Allow)
		if err != nil {
			m.log.Error("stored network policy", "id", id, "err", err)
			continue
		}
		if _, has := gw.Link(id); !has {
			nsPath, err := m.driver.NetNS(ctx, id)
			if err == nil {
				_, err = gw.Attach(id, nsPath)
			}
			if err != nil {
				m.log.Warn("sandbox network not restored", "id", id, "err", err)
				m.audit(id, "network.lost", map[string]any{"reason": err.Error()})
				continue
			}
		}
		secrets, err := m.resolveSecrets(ctx, rec.Team, rec.Egress.Secrets)
		if err != nil {
			m.log.Warn("sandbox secrets not restored", "id", id, "err", err)
		}
		if err := m.activateNetwork(id, pol, secrets); err != nil {
			m.log.Error("restore sandbox network", "id", id, "err", err)
		}
	}
}

// RefreshSecrets re-reads the secrets of every live sandbox of team that
// uses name, after team's secret was changed or deleted (another team's
// sandboxes using a secret of that name are not theirs to change).
func (m *Manager) RefreshSecrets(ctx context.Context, team, name string) {
	if team == "" {
		team = store.DefaultTeam
	}
	m.mu.Lock()
	var recs []*store.Sandbox
	for _, ls := range m.live {
		if !ls.ending && ls.rec.Team == team && slices.Contains(ls.rec.Egress.Secrets, name) {
			recs = append(recs, ls.rec)
		}
	}
	m.mu.Unlock()
	m.netMu.Lock()
	defer m.netMu.Unlock()
	for _, rec := range recs {
		var secrets []egress.Secret
		for _, n := range rec.Egress.Secrets {
			s, err := m.resolveSecrets(ctx, rec.Team, []string{n})
			if err == nil {
				secrets = append(secrets, s...)
			}
		}
		pol, err := parsePolicy(rec.Network, rec.Egress.Allow)
		if err == nil {
			_ = m.activateNetwork(rec.ID, pol, secrets)
		}
	}
}

// NetworkUsage returns a running sandbox's egress counters.
func (m *Manager) NetworkUsage(id string) (egress.Usage, bool) {
	if m.cfg.Gateway == nil {
		return egress.Usage{}, false
	}
	if _, ok := m.cfg.Gateway.Link(id); !ok {
		return egress.Usage{}, false
	}
	return m.cfg.Gateway.Usage(id), true
}

// audit records an event of sandbox id when the manager has an audit
// log; the store gives it the sandbox's task.
func (m *Manager) audit(id, kind string, data any) {
	if m.cfg.Audit != nil {
		m.cfg.Audit.Record(id, kind, data)
	}
}

// auditBy records an event a request caused: with the team and API key
// id of the actor ctx carries.
func (m *Manager) auditBy(ctx context.Context, id, kind string, data any) {
	if m.cfg.Audit != nil {
		m.cfg.Audit.RecordBy(ctx, id, kind, data)
	}
}

// RecordEvent records an event of sandbox id (and its task) that the
// request of ctx caused, for events the API observes (file operations).
func (m *Manager) RecordEvent(ctx context.Context, id, kind string, data any) {
	m.auditBy(ctx, id, kind, data)
}
