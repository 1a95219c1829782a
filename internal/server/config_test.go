package server

import (
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
)

// TestValidateBounds defends against out-of-range settings that the server
// accepted and then silently replaced (a loop window of 500 clamped to
// 100, a negative budget or egress cap taken as "the default", a /30 veth
// range that disabled networking at start with only a log line) or refused
// with one message for several settings that named neither the value nor
// the range: each value out of its range is refused with its flag's name,
// the value and the bounds (the constants Validate checks against), the
// bounds themselves are accepted, and a refused Config is left as it was.
func TestValidateBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string // "" : accepted
	}{
		{"kill-grace over", func(c *Config) { c.KillGrace = MaxKillGrace + time.Second }, "kill-grace 1m1s: must be 0s..1m0s"},
		{"kill-grace at max", func(c *Config) { c.KillGrace = MaxKillGrace }, ""},
		{"kill-grace negative", func(c *Config) { c.KillGrace = -time.Second }, "kill-grace -1s: must be 0s..1m0s"},
		{"death-check over", func(c *Config) { c.DeathCheckInterval = 2 * time.Minute }, "death-check-interval 2m0s: must be 0s..1m0s"},
		{"loop-window over", func(c *Config) { c.Loop.Window = govern.MaxLoopWindow + 1 }, "loop-window 101: must be 0..100"},
		{"loop-window at max", func(c *Config) { c.Loop.Window = govern.MaxLoopWindow }, ""},
		{"task-max-calls over", func(c *Config) { c.Budgets.MaxCalls = govern.MaxCallsCeiling + 1 }, "task-max-calls 1000001: must be 0..1000000"},
		{"task-max-duration over", func(c *Config) { c.Budgets.MaxDuration = govern.MaxDurationCeiling + time.Hour }, "task-max-duration 169h0m0s: must be 0s..168h0m0s"},
		{"task-max-tokens over", func(c *Config) { c.Budgets.MaxTokens = govern.MaxTokensCeiling + 1 }, "task-max-tokens 1099511627777: must be 0..1099511627776"},
		{"task-max-sandboxes negative", func(c *Config) { c.Budgets.MaxSandboxes = -1 }, "task-max-sandboxes -1: must be 0..1000"},
		{"task-max-cpu NaN", func(c *Config) { c.Budgets.MaxCPUSeconds = math.NaN() }, "task-max-cpu NaN: must be 0..1e+07"},
		{"max-sandboxes negative", func(c *Config) { c.Admission.MaxConcurrent = -1 }, "max-sandboxes -1: must not be negative"},
		{"max-output negative", func(c *Config) { c.MaxOutput = -1 }, "max-output -1: must not be negative"},
		{"agent-rate infinite", func(c *Config) { c.Admission.AgentRate = math.Inf(1) }, "agent-rate +Inf: must be a finite number"},
		{"agent-rate negative", func(c *Config) { c.Admission.AgentRate = -0.5 }, "agent-rate -0.5: must not be negative"},
		{"egress-max-conns negative", func(c *Config) { c.EgressLimits.MaxConns = -3 }, "egress-max-conns -3: must not be negative"},
		{"http-stall-timeout negative", func(c *Config) { c.HTTPStallTimeout = -time.Second }, "http-stall-timeout -1s: must not be negative"},
		{"queue-timeout negative", func(c *Config) { c.Admission.QueueTimeout = -time.Second }, "queue-timeout -1s: must not be negative"},
		{"team-max-sandboxes negative", func(c *Config) { c.Admission.Team.MaxSandboxes = -1 }, "team-max-sandboxes -1: must be 0..1000000"},
		{"team-max-cpus negative", func(c *Config) { c.Admission.Team.MaxCPUs = -1 }, "team-max-cpus -1: must be 0..1e+06"},
		{"team-max-memory-mb over", func(c *Config) { c.Admission.Team.MaxMemoryMB = govern.MaxQuotaMemoryMB + 1 }, "team-max-memory-mb 1099511627777: must be 0..1099511627776"},
		{"team-create-rate infinite", func(c *Config) { c.Admission.Team.CreateRate = math.Inf(1) }, "team-create-rate +Inf: must be 0..1e+06"},
		{"team quotas at their ceilings", func(c *Config) {
			c.Admission.Team = govern.TeamQuota{MaxSandboxes: govern.MaxQuotaSandboxes, MaxPerAgent: 1, MaxCPUs: 0.5, MaxMemoryMB: 1 << 40, CreateRate: 0.1, CreateBurst: 1}
		}, ""},
		{"sandbox-net too small", func(c *Config) { c.NetworkRange = netip.MustParsePrefix("10.9.0.0/30") }, "sandbox-net: range 10.9.0.0/30: need an IPv4 prefix of /28 or larger"},
		{"sandbox-net IPv6", func(c *Config) { c.NetworkRange = netip.MustParsePrefix("fd00::/64") }, "sandbox-net: range fd00::/64"},
		{"sandbox-net /28", func(c *Config) { c.NetworkRange = netip.MustParsePrefix("10.9.0.0/28") }, ""},
		{"egress-resolver without port", func(c *Config) { c.EgressResolver = "127.0.0.53" }, `egress-resolver "127.0.0.53"`},
		{"listen without port", func(c *Config) { c.Listen = "localhost" }, `listen "localhost"`},
		{"cpu-runaway-action", func(c *Config) { c.RunawayAction = "host" }, `cpu-runaway-action "host": use sandbox or command`},
		{"ports-default", func(c *Config) { c.PortsDefault = "open" }, `ports-default "open": use public or private`},
		{"ports-default private", func(c *Config) { c.PortsDefault = "private" }, ""},
		// A store that is no PostgreSQL URL is refused without echoing it
		// (a URL may hold a password).
		{"store not postgres", func(c *Config) { c.Store = "mysql://u:hunter2@h/db" }, "store: want a postgres:// or postgresql:// URL"},
		{"store postgres", func(c *Config) { c.Store = "postgres://corral@127.0.0.1:5432/corral" }, ""},
		{"store postgresql", func(c *Config) { c.Store = "postgresql://corral@127.0.0.1/corral" }, ""},
		{"negative disables cpu-runaway-for and audit bounds", func(c *Config) {
			c.Watchdog.CPURunawayFor, c.AuditRetention.MaxAge, c.AuditRetention.MaxEvents, c.RefusalEvents = -1, -1, -1, -1
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{DataDir: t.TempDir()}
			tc.set(&c)
			before := c
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("Validate() = %v: the refusal shows a password", err)
			}
			// NaN != NaN: compare the rest.
			if tc.name != "task-max-cpu NaN" && !reflect.DeepEqual(c, before) {
				t.Errorf("a refused Config was changed:\n%+v\nwas\n%+v", c, before)
			}
		})
	}
}

// TestValidateReportsAll defends against fixing a configuration one
// restart at a time: every out-of-range setting is named in one error.
func TestValidateReportsAll(t *testing.T) {
	c := Config{KillGrace: time.Hour, Admission: govern.AdmissionConfig{MaxConcurrent: -1}, Loop: govern.LoopConfig{Window: 1000}}
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{"kill-grace", "max-sandboxes", "loop-window"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %s", err, w)
		}
	}
}
