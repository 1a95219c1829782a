package sandbox

import (
	"fmt"
	"math"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// Tier is a named set of default limits (the seed design's tiers).
type Tier struct {
	Resources      store.Resources
	CommandTimeout time.Duration
}

// Tiers are the named resource tiers. Explicit values override them.
var Tiers = map[string]Tier{
	"light":  {store.Resources{CPU: 0.5, MemoryMB: 256, DiskMB: 100, Pids: 256, Nofile: 4096}, 30 * time.Second},
	"medium": {store.Resources{CPU: 1, MemoryMB: 1024, DiskMB: 500, Pids: 512, Nofile: 8192}, 5 * time.Minute},
	"heavy":  {store.Resources{CPU: 2, MemoryMB: 4096, DiskMB: 2048, Pids: 1024, Nofile: 16384}, 30 * time.Minute},
}

// DefaultTier is used when a create request names none.
const DefaultTier = "light"

// Bounds on the values a caller may ask for.
const (
	MinCPU, MaxCPU           = 0.01, 64
	MinMemoryMB, MaxMemoryMB = 16, 256 * 1024
	MinDiskMB, MaxDiskMB     = 1, 1024 * 1024
	MinPids, MaxPids         = 16, 65536
	MinNofile, MaxNofile     = 64, 1 << 20
	MaxTTL                   = 24 * time.Hour
	MaxCommandTimeout        = 24 * time.Hour
	MaxEnvVars               = 256
	MaxEnvBytes              = 32 << 10
	MaxMetadata              = 64
	MaxMetadataKey           = 256
	MaxMetadataValue         = 1024
)

// ResourceRequest holds optional overrides; zero means "use the tier".
type ResourceRequest struct {
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	Pids     int64   `json:"pids,omitempty"`
	Nofile   int64   `json:"nofile,omitempty"`
}

// InvalidError is a caller mistake; the API maps it to 400 invalid_argument.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

func invalid(format string, args ...any) error {
	return &InvalidError{Msg: fmt.Sprintf(format, args...)}
}

// resolveResources applies overrides on a tier and checks every bound.
// Negative, NaN or absurd values are refused, never clamped.
func resolveResources(tier Tier, r *ResourceRequest) (store.Resources, error) {
	out := tier.Resources
	if r == nil {
		return out, nil
	}
	if math.IsNaN(r.CPU) || math.IsInf(r.CPU, 0) {
		return out, invalid("resources.cpu must be a number")
	}
	checks := []struct {
		name     string
		set      bool
		ok       bool
		min, max float64
	}{
		{"cpu", r.CPU != 0, r.CPU >= MinCPU && r.CPU <= MaxCPU, MinCPU, MaxCPU},
		{"memory_mb", r.MemoryMB != 0, r.MemoryMB >= MinMemoryMB && r.MemoryMB <= MaxMemoryMB, MinMemoryMB, MaxMemoryMB},
		{"disk_mb", r.DiskMB != 0, r.DiskMB >= MinDiskMB && r.DiskMB <= MaxDiskMB, MinDiskMB, MaxDiskMB},
		{"pids", r.Pids != 0, r.Pids >= MinPids && r.Pids <= MaxPids, MinPids, MaxPids},
		{"nofile", r.Nofile != 0, r.Nofile >= MinNofile && r.Nofile <= MaxNofile, MinNofile, MaxNofile},
	}
	for _, c := range checks {
		if c.set && !c.ok {
			return out, invalid("resources.%s must be between %g and %g", c.name, c.min, c.max)
		}
	}
	if r.CPU != 0 {
		out.CPU = r.CPU
	}
	if r.MemoryMB != 0 {
		out.MemoryMB = r.MemoryMB
	}
	if r.DiskMB != 0 {
		out.DiskMB = r.DiskMB
	}
	if r.Pids != 0 {
		out.Pids = r.Pids
	}
	if r.Nofile != 0 {
		out.Nofile = r.Nofile
	}
	return out, nil
}
