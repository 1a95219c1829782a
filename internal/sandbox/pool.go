package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/pool"
	"github.com/corralhq/corral/internal/runtime"
)

// PoolConfig is the warm pool of one template (see package pool).
type PoolConfig = pool.Config

// PoolStats describes one pool.
type PoolStats = pool.Stats

// warmPools is what the Manager needs of the warm pools (*pool.Pools):
// claim an idle sandbox for a create, make room for a user's sandbox,
// refill, drain, and the pools' configuration.
type warmPools interface {
	// Owns: the reaper leaves the pools' sandboxes alone.
	Owns(id string) bool
	// Take claims an idle sandbox of a team's pool of a template version; Release (it is
	// live now) or DiscardLater (the create gave up) ends the claim.
	Take(team, template, version string) *pool.Idle
	Release(id string)
	// DiscardLater discards in the background; Drain waits for it, and
	// once drained it does nothing (Drain stops every taken sandbox).
	DiscardLater(pd *pool.Idle)
	// Free is the room left under the global limit, pools included;
	// MakeRoom evicts an idle sandbox when there is none.
	Free() int
	MakeRoom()
	// Refill tops the pools up, or empties them under memory pressure;
	// Drain stops every pooled sandbox, idle or taken and not released,
	// waiting for the refills and discards in flight (shutdown).
	Refill()
	Drain()
	Load(ctx context.Context)
	Set(ctx context.Context, c pool.Config) (pool.Stats, error)
	List() []pool.Stats
}

// poolStarter starts and stops the pools' sandboxes for them
// (pool.Starter); it keeps the Manager's own method set free of them.
type poolStarter struct{ m *Manager }

var noPolicy = egress.Policy{Mode: egress.ModeNone}

// StartIdle starts one sandbox of team with the template's defaults,
// without a record: it gets one when a create of team takes it.
func (s poolStarter) StartIdle(team, template string, claim func(id string)) (*pool.Idle, error) {
	m := s.m
	req := CreateRequest{Template: template, Team: team}
	rec, rc, err := m.validateBase(&req)
	if err != nil {
		return nil, err
	}
	done, ok := m.beginWork() // Shutdown waits for this start
	if !ok {
		return nil, fmt.Errorf("%w: %w", pool.ErrClosed, ErrShuttingDown)
	}
	defer done()
	if err := m.prepareNetwork(rec, &rc, noPolicy, nil); err != nil {
		return nil, err
	}
	claim(rec.ID)
	if _, err := m.driver.Start(context.Background(), rc); err != nil {
		return nil, err
	}
	return &pool.Idle{ID: rec.ID, Token: rec.AccessToken, Version: rec.TemplateVersion, Started: time.Now()}, nil
}

func (s poolStarter) StopIdle(id string) {
	if err := s.m.driver.Stop(context.Background(), id, 0); err != nil {
		s.m.log.Error("stop pooled sandbox", "id", id, "err", err)
	}
}

func (s poolStarter) Alive(id string) bool { return s.m.driver.Alive(id) }

func (s poolStarter) Room() int {
	s.m.mu.Lock()
	n := len(s.m.live)
	s.m.mu.Unlock()
	return s.m.cfg.Admission.Config().MaxConcurrent - n
}

// poolable reports whether a create request can be served by a pooled
// sandbox: template defaults only (no env, network, secrets, snapshot,
// runtime, tier or resources other than the defaults). TTL, metadata,
// task, agent and command timeout are applied when it is taken.
func poolable(req *CreateRequest) bool {
	return len(req.Env) == 0 && (req.Network == "" || req.Network == "none") && len(req.Allow) == 0 &&
		len(req.Secrets) == 0 && req.Snapshot == "" && (req.Runtime == "" || req.Runtime == string(runtime.Runc)) &&
		(req.Tier == "" || req.Tier == DefaultTier) && req.Resources == nil && len(req.Volumes) == 0
}

// SetPool creates or changes c.Team's pool of a template (min 0 and max
// 0 removes it, killing its idle sandboxes).
func (m *Manager) SetPool(ctx context.Context, c PoolConfig) (PoolStats, error) {
	if m.shared {
		// Idle sandboxes have no record, which other nodes sharing the
		// runtime would reclaim as orphans: the driver keeps warm pools
		// of its own (--kube-pools).
		return PoolStats{}, fmt.Errorf("warm pools through the API (the runtime's warm pools are its own, --kube-pools): %w", runtime.ErrUnsupported)
	}
	if c.Template == "" {
		c.Template = m.cfg.DefaultTemplate
	}
	if !templateNameRe.MatchString(c.Template) || strings.HasPrefix(c.Template, SnapshotPrefix) {
		return PoolStats{}, invalid("template %q is not a valid template name", c.Template)
	}
	if _, err := m.resolveTemplate(ctx, c.Template, teamOr(c.Team)); err != nil {
		return PoolStats{}, err
	}
	st, err := m.pools.Set(ctx, c)
	var inv *pool.InvalidError
	if errors.As(err, &inv) {
		return PoolStats{}, invalid("%s", inv.Msg)
	}
	return st, err
}

// Pools returns every team's pools' configuration and counters (the
// caller shows each team its own).
func (m *Manager) Pools() []PoolStats { return m.pools.List() }

// RefillPools runs one refill pass of the warm pools now (the watch loop
// runs one every second).
func (m *Manager) RefillPools() { m.pools.Refill() }
