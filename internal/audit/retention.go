package audit

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// Retention defaults (see [Retention]).
const (
	DefaultMaxAge        = 30 * 24 * time.Hour
	DefaultMaxEvents     = 1_000_000
	DefaultMaxCommands   = 1_000_000
	DefaultPruneInterval = time.Hour
)

// Retention bounds the audit log and the command records (issue 10 item
// 4: nothing was ever deleted, so a busy server's database only grew).
// Zero fields take the defaults; a negative field turns its bound off.
type Retention struct {
	// MaxAge: events, ended commands and usage rows older than this are
	// deleted (default [DefaultMaxAge], 30 days).
	MaxAge time.Duration
	// MaxEvents is the most events kept; the oldest go first (default
	// [DefaultMaxEvents]).
	MaxEvents int64
	// MaxCommands is the most command records kept (default
	// [DefaultMaxCommands]).
	MaxCommands int64
	// ArchiveDir, when set, receives every event before it is deleted,
	// one gzip-compressed JSON Lines file per prune
	// (events-<first id>-<last id>.jsonl.gz, the format of
	// `corral audit export`); events are deleted only once their file is
	// on disk. "" deletes without an archive.
	ArchiveDir string
	// Interval is the time between prunes (default
	// [DefaultPruneInterval]); the first runs at start.
	Interval time.Duration
}

func (r Retention) withDefaults() Retention {
	if r.MaxAge == 0 {
		r.MaxAge = DefaultMaxAge
	}
	if r.MaxEvents == 0 {
		r.MaxEvents = DefaultMaxEvents
	}
	if r.MaxCommands == 0 {
		r.MaxCommands = DefaultMaxCommands
	}
	if r.Interval <= 0 {
		r.Interval = DefaultPruneInterval
	}
	return r
}

// Pruned is what one prune deleted.
type Pruned struct {
	// Events is how many events were deleted, FirstID..LastID and
	// From..To their ids and times.
	Events          int64
	FirstID, LastID int64
	From, To        time.Time
	// Reason is "age", "size" or "age and size".
	Reason string
	// Archive is the file the events were written to ("" without one).
	Archive string
	// Commands is how many command records were deleted.
	Commands int64
	// Usage is how many usage rows (per sandbox and minute) were
	// deleted: they are kept for MaxAge, like the events.
	Usage int64
}

// Prune applies r once, at now: events beyond it are written to the
// archive, then deleted oldest first, and so are command records beyond
// it and usage rows older than MaxAge. When anything was deleted it
// records one "audit.pruned" event saying what (counts, id and time range, reason, archive file); a
// failure is recorded as "audit.prune_failed" and deletes nothing more.
func (l *Log) Prune(ctx context.Context, r Retention, now time.Time) (Pruned, error) {
	p, err := l.prune(ctx, r.withDefaults(), now)
	if err != nil {
		l.Record("", "audit.prune_failed", map[string]any{"error": err.Error(), "events": p.Events, "commands": p.Commands})
		return p, err
	}
	if p.Events > 0 || p.Commands > 0 || p.Usage > 0 {
		d := map[string]any{"events": p.Events, "commands": p.Commands, "usage_rows": p.Usage, "reason": p.Reason, "archive": p.Archive,
			"max_age_s": int64(r.withDefaults().MaxAge.Seconds()), "max_events": r.withDefaults().MaxEvents}
		if p.Events > 0 {
			d["first_id"], d["last_id"], d["from"], d["to"] = p.FirstID, p.LastID, p.From, p.To
		}
		l.Record("", "audit.pruned", d)
	}
	return p, nil
}

func (l *Log) prune(ctx context.Context, r Retention, now time.Time) (Pruned, error) {
	var p Pruned
	var before time.Time
	if r.MaxAge > 0 {
		before = now.Add(-r.MaxAge)
	}
	byAge, err := l.st.EventsBeyond(ctx, before, 0)
	if err != nil {
		return p, err
	}
	bySize, err := l.st.EventsBeyond(ctx, time.Time{}, r.MaxEvents)
	if err != nil {
		return p, err
	}
	cut := max(byAge, bySize)
	switch {
	case byAge > 0 && bySize > 0:
		p.Reason = "age and size"
	case byAge > 0:
		p.Reason = "age"
	case bySize > 0:
		p.Reason = "size"
	}
	if cut > 0 {
		if r.ArchiveDir != "" {
			if p.Archive, err = l.archive(ctx, r.ArchiveDir, cut, &p); err != nil {
				return p, err
			}
		} else if err := l.bounds(ctx, cut, &p); err != nil {
			return p, err
		}
		if p.Events, err = l.st.DeleteEventsThrough(ctx, cut); err != nil {
			return p, err
		}
	}
	if p.Commands, err = l.st.PruneCommands(ctx, before, r.MaxCommands); err != nil {
		return p, err
	}
	p.Usage, err = l.st.PruneUsage(ctx, before)
	return p, err
}

// bounds fills p's id and time range of the events up to cut.
func (l *Log) bounds(ctx context.Context, cut int64, p *Pruned) error {
	first, err := l.st.ListEvents(ctx, store.EventFilter{Limit: 1})
	if err != nil {
		return err
	}
	last, err := l.st.ListEvents(ctx, store.EventFilter{AfterID: cut - 1, Limit: 1})
	if err != nil {
		return err
	}
	if len(first) == 1 && len(last) == 1 {
		p.FirstID, p.From, p.LastID, p.To = first[0].ID, first[0].At, last[0].ID, last[0].At
	}
	return nil
}

// archive writes the events up to cut to a new file in dir (written to a
// temporary name, synced, then renamed and the directory synced, so that
// a crash leaves either the whole file or none) and returns its path.
func (l *Log) archive(ctx context.Context, dir string, cut int64, p *Pruned) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("audit archive: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".events-*.tmp")
	if err != nil {
		return "", fmt.Errorf("audit archive: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	defer tmp.Close()
	zw := gzip.NewWriter(tmp)
	bw := bufio.NewWriter(zw)
	var after int64
	for after < cut {
		evs, err := l.st.ListEvents(ctx, store.EventFilter{AfterID: after})
		if err != nil {
			return "", err
		}
		if len(evs) == 0 {
			break
		}
		for _, ev := range evs {
			if ev.ID > cut {
				break
			}
			if p.FirstID == 0 {
				p.FirstID, p.From = ev.ID, ev.At
			}
			p.LastID, p.To = ev.ID, ev.At
			if err := WriteJSONL(bw, ev); err != nil {
				return "", fmt.Errorf("audit archive: %w", err)
			}
			after = ev.ID
		}
		if evs[len(evs)-1].ID > cut {
			break
		}
	}
	if p.FirstID == 0 {
		return "", errors.New("audit archive: no events to archive")
	}
	if err := bw.Flush(); err != nil {
		return "", fmt.Errorf("audit archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("audit archive: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return "", fmt.Errorf("audit archive: %w", err)
	}
	name := filepath.Join(dir, fmt.Sprintf("events-%012d-%012d.jsonl.gz", p.FirstID, p.LastID))
	if err := os.Rename(tmp.Name(), name); err != nil {
		return "", fmt.Errorf("audit archive: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return "", fmt.Errorf("audit archive: %w", err)
		}
	}
	return name, nil
}

// WriteJSONL writes ev as one line of JSON (id, time, sandbox, task,
// kind, data): the format of the archive, `corral audit --json` and
// `corral audit export`.
func WriteJSONL(w interface{ Write([]byte) (int, error) }, ev *store.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// RunRetention prunes with r at once and then every r.Interval until ctx
// is done. Failures are recorded (audit.prune_failed) and logged; the
// next prune tries again.
func (l *Log) RunRetention(ctx context.Context, r Retention) {
	r = r.withDefaults()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if _, err := l.Prune(ctx, r, time.Now()); err != nil && ctx.Err() == nil {
			l.log.Error("audit retention", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
