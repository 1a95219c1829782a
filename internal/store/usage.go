package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// UsageBucket is the width of a usage row: amounts are kept per sandbox
// and minute, so a usage query's since and until are rounded out to
// whole minutes.
const UsageBucket = time.Minute

// usageSchema holds the usage meter's tables (internal/usage):
//
//   - usage: per sandbox and minute (bucket: the minute's start, unix
//     seconds), what the sandbox used: CPU seconds, memory GiB-seconds,
//     egress bytes each way and commands started;
//   - usage_baselines: per live sandbox, the watchdog's last cumulative
//     CPU reading and memory sample the rows above account for, so that a
//     restarted server counts only what is new since (not the whole
//     counter again);
//   - sandboxes_ended: an index on sandboxes(ended_at) for the
//     sandbox-seconds counter's scrape.
const usageSchema = `
CREATE TABLE IF NOT EXISTS usage (
	sandbox_id TEXT NOT NULL,
	bucket INTEGER NOT NULL,
	cpu_seconds REAL NOT NULL DEFAULT 0,
	memory_gib_seconds REAL NOT NULL DEFAULT 0,
	egress_bytes_up INTEGER NOT NULL DEFAULT 0,
	egress_bytes_down INTEGER NOT NULL DEFAULT 0,
	commands INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (sandbox_id, bucket)
);
CREATE INDEX IF NOT EXISTS usage_bucket ON usage(bucket);
CREATE TABLE IF NOT EXISTS usage_baselines (
	sandbox_id TEXT PRIMARY KEY,
	cpu_seconds REAL NOT NULL,
	memory_bytes INTEGER NOT NULL,
	sampled_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_ended ON sandboxes(ended_at);
`

// UsageAmounts are metered amounts.
type UsageAmounts struct {
	// CPUSeconds is CPU time used (all cores together).
	CPUSeconds float64
	// MemoryGiBSeconds is memory use integrated over time.
	MemoryGiBSeconds float64
	// EgressBytesUp and EgressBytesDown are the bytes the egress proxy
	// carried upstream and back (its audit events' bytes_up, bytes_down).
	EgressBytesUp, EgressBytesDown int64
	// Commands is the number of commands started.
	Commands int64
}

// Add adds b to a.
func (a *UsageAmounts) Add(b UsageAmounts) {
	a.CPUSeconds += b.CPUSeconds
	a.MemoryGiBSeconds += b.MemoryGiBSeconds
	a.EgressBytesUp += b.EgressBytesUp
	a.EgressBytesDown += b.EgressBytesDown
	a.Commands += b.Commands
}

// UsageRecord is what one sandbox used in one bucket.
type UsageRecord struct {
	SandboxID string
	// Bucket is the start of the minute (UTC, whole minutes).
	Bucket time.Time
	UsageAmounts
}

// UsageBaseline is the last watchdog sample of a sandbox that the usage
// rows account for.
type UsageBaseline struct {
	SandboxID   string
	CPUSeconds  float64
	MemoryBytes int64
	SampledAt   time.Time
}

// WriteUsage adds records to the usage rows (amounts of a sandbox and
// bucket already stored are added to), stores baselines (replacing the
// sandboxes' previous ones) and deletes the baselines of the sandboxes in
// drop, all in one transaction: a crash keeps all of it or none.
func (s *Store) WriteUsage(ctx context.Context, recs []UsageRecord, baselines []UsageBaseline, drop []string) error {
	err := s.db.inTx(ctx, false, func(tx *tx) error { return writeUsage(ctx, tx, recs, baselines, drop) })
	if err != nil {
		return fmt.Errorf("write usage: %w", err)
	}
	return nil
}

func writeUsage(ctx context.Context, tx *tx, recs []UsageRecord, baselines []UsageBaseline, drop []string) error {
	for _, r := range recs {
		_, err := tx.ExecContext(ctx, `INSERT INTO usage (sandbox_id, bucket, cpu_seconds, memory_gib_seconds, egress_bytes_up, egress_bytes_down, commands)
			VALUES (?,?,?,?,?,?,?) ON CONFLICT (sandbox_id, bucket) DO UPDATE SET
			cpu_seconds = usage.cpu_seconds + excluded.cpu_seconds,
			memory_gib_seconds = usage.memory_gib_seconds + excluded.memory_gib_seconds,
			egress_bytes_up = usage.egress_bytes_up + excluded.egress_bytes_up,
			egress_bytes_down = usage.egress_bytes_down + excluded.egress_bytes_down,
			commands = usage.commands + excluded.commands`,
			r.SandboxID, r.Bucket.Unix(), r.CPUSeconds, r.MemoryGiBSeconds, r.EgressBytesUp, r.EgressBytesDown, r.Commands)
		if err != nil {
			return fmt.Errorf("write usage of %s: %w", r.SandboxID, err)
		}
	}
	for _, b := range baselines {
		if _, err := tx.ExecContext(ctx, `INSERT INTO usage_baselines (sandbox_id, cpu_seconds, memory_bytes, sampled_at) VALUES (?,?,?,?)
			ON CONFLICT (sandbox_id) DO UPDATE SET cpu_seconds=excluded.cpu_seconds, memory_bytes=excluded.memory_bytes, sampled_at=excluded.sampled_at`,
			b.SandboxID, b.CPUSeconds, b.MemoryBytes, b.SampledAt.UnixMicro()); err != nil {
			return fmt.Errorf("write usage baseline of %s: %w", b.SandboxID, err)
		}
	}
	for _, id := range drop {
		if _, err := tx.ExecContext(ctx, `DELETE FROM usage_baselines WHERE sandbox_id=?`, id); err != nil {
			return fmt.Errorf("drop usage baseline of %s: %w", id, err)
		}
	}
	return nil
}

// UsageBaselines returns every stored baseline by sandbox id.
func (s *Store) UsageBaselines(ctx context.Context) (map[string]UsageBaseline, error) {
	rows, err := queryAll(ctx, s.db, "usage baselines", `SELECT sandbox_id, cpu_seconds, memory_bytes, sampled_at FROM usage_baselines`, nil,
		func(sc scanner) (UsageBaseline, error) {
			var b UsageBaseline
			var at int64
			err := sc.Scan(&b.SandboxID, &b.CPUSeconds, &b.MemoryBytes, &at)
			b.SampledAt = time.UnixMicro(at).UTC()
			return b, err
		})
	if err != nil {
		return nil, err
	}
	out := make(map[string]UsageBaseline, len(rows))
	for _, b := range rows {
		out[b.SandboxID] = b
	}
	return out, nil
}

// SandboxOwner is a sandbox's team and whether it has ended.
type SandboxOwner struct {
	Team  string
	Ended bool
}

// SandboxOwners returns the team and state of each of ids that has a
// record (ids without one are absent).
func (s *Store) SandboxOwners(ctx context.Context, ids []string) (map[string]SandboxOwner, error) {
	out := make(map[string]SandboxOwner, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), 500)
		chunk := ids[:n]
		ids = ids[n:]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		type owner struct {
			id string
			SandboxOwner
		}
		rows, err := queryAll(ctx, s.db, "sandbox owners", `SELECT id, team, state FROM sandboxes WHERE id IN (?`+strings.Repeat(",?", n-1)+`)`, args,
			func(sc scanner) (owner, error) {
				var o owner
				var state string
				err := sc.Scan(&o.id, &o.Team, &state)
				o.Ended = state == StateEnded
				return o, err
			})
		if err != nil {
			return nil, err
		}
		for _, o := range rows {
			out[o.id] = o.SandboxOwner
		}
	}
	return out, nil
}

// UsageTotalsByTeam sums every stored usage row by the team of its
// sandbox (rows whose sandbox has no record are left out).
func (s *Store) UsageTotalsByTeam(ctx context.Context) (map[string]UsageAmounts, error) {
	type teamAmounts struct {
		team string
		UsageAmounts
	}
	rows, err := queryAll(ctx, s.db, "usage totals", `SELECT s.team, `+usageSums+` FROM usage u JOIN sandboxes s ON s.id = u.sandbox_id GROUP BY s.team`, nil,
		func(sc scanner) (teamAmounts, error) {
			var t teamAmounts
			err := sc.Scan(&t.team, &t.CPUSeconds, &t.MemoryGiBSeconds, &t.EgressBytesUp, &t.EgressBytesDown, &t.Commands)
			return t, err
		})
	if err != nil {
		return nil, err
	}
	out := make(map[string]UsageAmounts, len(rows))
	for _, r := range rows {
		out[r.team] = r.UsageAmounts
	}
	return out, nil
}

// usageSums are the summed amount columns of usage rows u, in
// UsageAmounts order.
const usageSums = `COALESCE(SUM(u.cpu_seconds), 0), COALESCE(SUM(u.memory_gib_seconds), 0), COALESCE(SUM(u.egress_bytes_up), 0), COALESCE(SUM(u.egress_bytes_down), 0), COALESCE(SUM(u.commands), 0)`

// SandboxSecondsByTeam sums, by team, the lives (created_at to ended_at,
// or to now for a sandbox that has not ended) of the sandboxes that have
// not ended or ended after endedAfter, and, separately, of those that
// ended in (endedAfter, endedThrough]. Both queries use the indexes on
// ended_at, so a caller that keeps the sum of the sandboxes ended up to a
// watermark reads only the recent ones.
func (s *Store) SandboxSecondsByTeam(ctx context.Context, endedAfter, endedThrough, now time.Time) (recent, settled map[string]float64, err error) {
	type teamSeconds struct {
		team string
		ms   int64
	}
	scan := func(sc scanner) (teamSeconds, error) {
		var t teamSeconds
		err := sc.Scan(&t.team, &t.ms)
		return t, err
	}
	toMap := func(rows []teamSeconds) map[string]float64 {
		out := make(map[string]float64, len(rows))
		for _, r := range rows {
			out[r.team] = float64(r.ms) / 1000
		}
		return out
	}
	rows, err := queryAll(ctx, s.db, "sandbox seconds", `SELECT team, COALESCE(SUM(GREATEST(0, COALESCE(ended_at, ?) - created_at)), 0) FROM sandboxes
		WHERE ended_at IS NULL OR ended_at > ? GROUP BY team`, []any{ms(now), ms(endedAfter)}, scan)
	if err != nil {
		return nil, nil, err
	}
	recent = toMap(rows)
	if endedThrough.After(endedAfter) {
		rows, err = queryAll(ctx, s.db, "sandbox seconds", `SELECT team, COALESCE(SUM(GREATEST(0, ended_at - created_at)), 0) FROM sandboxes
			WHERE ended_at > ? AND ended_at <= ? GROUP BY team`, []any{ms(endedAfter), ms(endedThrough)}, scan)
		if err != nil {
			return nil, nil, err
		}
	} else {
		rows = nil
	}
	return recent, toMap(rows), nil
}

// Usage groupings (UsageQuery.By).
const (
	UsageByTeam    = "team"
	UsageByAgent   = "agent"
	UsageByTask    = "task"
	UsageBySandbox = "sandbox"
)

// UsageQuery selects usage.
type UsageQuery struct {
	// Team restricts the answer to one team ("" = every team).
	Team string
	// Since and Until bound the time: usage rows whose minute starts at
	// or after Since and before Until (both must be whole minutes; zero:
	// unbounded), and the part of each sandbox's life inside [Since,
	// min(Until, Now)).
	Since, Until time.Time
	// By groups the rows: UsageByTeam, UsageByAgent (team and agent),
	// UsageByTask (team, task and its agent) or UsageBySandbox (team,
	// sandbox, task, agent).
	By string
	// Now ends the lives of sandboxes that have not ended.
	Now time.Time
}

// UsageRow is the usage of one group.
type UsageRow struct {
	Team, Agent, Task, Sandbox string
	UsageAmounts
	// SandboxSeconds is the time the group's sandboxes existed (created
	// to ended, paused time included) inside the window.
	SandboxSeconds float64
	// Sandboxes counts the group's sandboxes that existed in the window.
	Sandboxes int64
}

// usageGroups are the group columns of each grouping, over sandboxes s
// and tasks t.
var usageGroups = map[string][]string{
	UsageByTeam:    {"s.team"},
	UsageByAgent:   {"s.team", "COALESCE(t.agent, '')"},
	UsageByTask:    {"s.team", "COALESCE(t.agent, '')", "s.task_id"},
	UsageBySandbox: {"s.team", "COALESCE(t.agent, '')", "s.task_id", "s.id"},
}

// UsageReport returns the usage of each group of q.By in q's window, in
// group order. Sandboxes whose record is gone, or that used nothing and
// did not exist in the window, are absent.
func (s *Store) UsageReport(ctx context.Context, q UsageQuery) ([]*UsageRow, error) {
	cols, ok := usageGroups[q.By]
	if !ok {
		return nil, fmt.Errorf("usage report: unknown grouping %q", q.By)
	}
	group := strings.Join(cols, ", ")
	const maxTime = int64(1) << 62
	var since, until, sinceMS, untilMS int64 = 0, maxTime, 0, maxTime
	if !q.Since.IsZero() {
		since, sinceMS = q.Since.Unix(), ms(q.Since)
	}
	if !q.Until.IsZero() {
		until, untilMS = q.Until.Unix(), ms(q.Until)
	}
	nowMS := ms(q.Now)
	rows := map[[4]string]*UsageRow{}
	var order [][4]string
	row := func(key [4]string) *UsageRow {
		r := rows[key]
		if r == nil {
			r = &UsageRow{Team: key[0], Agent: key[1], Task: key[2], Sandbox: key[3]}
			rows[key] = r
			order = append(order, key)
		}
		return r
	}
	scanKey := func(sc scanner, rest ...any) ([4]string, error) {
		var key [4]string
		dest := make([]any, 0, len(cols)+len(rest))
		for i := range cols {
			dest = append(dest, &key[i])
		}
		return key, sc.Scan(append(dest, rest...)...)
	}
	type amounts struct {
		key [4]string
		UsageAmounts
	}
	used, err := queryAll(ctx, s.db, "usage report", `SELECT `+group+`, `+usageSums+`
		FROM usage u JOIN sandboxes s ON s.id = u.sandbox_id LEFT JOIN tasks t ON t.id = s.task_id
		WHERE (? = '' OR s.team = ?) AND u.bucket >= ? AND u.bucket < ?
		GROUP BY `+group+` ORDER BY `+group, []any{q.Team, q.Team, since, until},
		func(sc scanner) (amounts, error) {
			var a amounts
			var err error
			a.key, err = scanKey(sc, &a.CPUSeconds, &a.MemoryGiBSeconds, &a.EgressBytesUp, &a.EgressBytesDown, &a.Commands)
			return a, err
		})
	if err != nil {
		return nil, err
	}
	for _, a := range used {
		row(a.key).UsageAmounts = a.UsageAmounts
	}
	type life struct {
		key [4]string
		ms  int64
		n   int64
	}
	lives, err := queryAll(ctx, s.db, "usage report", `SELECT `+group+`,
		COALESCE(SUM(GREATEST(0, LEAST(COALESCE(s.ended_at, ?), ?) - GREATEST(s.created_at, ?))), 0), COUNT(*)
		FROM sandboxes s LEFT JOIN tasks t ON t.id = s.task_id
		WHERE (? = '' OR s.team = ?) AND s.created_at < ? AND (s.ended_at IS NULL OR s.ended_at > ?)
		GROUP BY `+group+` ORDER BY `+group,
		[]any{nowMS, min(nowMS, untilMS), sinceMS, q.Team, q.Team, min(untilMS, nowMS), sinceMS},
		func(sc scanner) (life, error) {
			var l life
			var err error
			l.key, err = scanKey(sc, &l.ms, &l.n)
			return l, err
		})
	if err != nil {
		return nil, err
	}
	for _, l := range lives {
		r := row(l.key)
		r.SandboxSeconds, r.Sandboxes = float64(l.ms)/1000, l.n
	}
	out := make([]*UsageRow, 0, len(order))
	slices.SortFunc(order, func(a, b [4]string) int {
		for i := range a {
			if c := strings.Compare(a[i], b[i]); c != 0 {
				return c
			}
		}
		return 0
	})
	for _, k := range order {
		out = append(out, rows[k])
	}
	return out, nil
}

// PruneUsage deletes the usage rows of minutes that started before
// before, oldest first, and returns how many it deleted. Baselines are
// not pruned here (they are dropped when their sandbox ends).
func (s *Store) PruneUsage(ctx context.Context, before time.Time) (int64, error) {
	if before.IsZero() {
		return 0, nil
	}
	var total int64
	for {
		r, err := s.db.ExecContext(ctx, `DELETE FROM usage WHERE (sandbox_id, bucket) IN (SELECT sandbox_id, bucket FROM usage WHERE bucket < ? ORDER BY bucket LIMIT ?)`,
			before.Unix(), pruneBatch)
		if err != nil {
			return total, fmt.Errorf("prune usage: %w", err)
		}
		n, _ := r.RowsAffected()
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
