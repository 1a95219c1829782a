package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/idrange"
)

// TestResolveIDRange defends against a data dir's files being mapped to
// the wrong host ids: templates, snapshots and volumes are owned by the
// range they were made with, so the range is recorded in the data dir and
// a different one is refused (a sandbox would see its files owned by ids
// outside its map); a data dir made before ranges were configurable keeps
// 100000, but only while nobody else holds it.
func TestResolveIDRange(t *testing.T) {
	auto := idrange.Range{Base: idrange.SearchBase, Count: idrange.Count}
	legacy := idrange.Range{Base: idrange.LegacyBase, Count: idrange.Count}
	other := idrange.Range{Base: 300000, Count: idrange.Count}
	for _, tt := range []struct {
		name   string
		record string // DATA/uid-range; "db" for a database without it
		subuid string
		want   idrange.Range
		got    idrange.Range
		err    string
	}{
		{name: "new data dir, free host: a free range", got: auto},
		{name: "new data dir, configured range", want: other, got: other},
		{name: "recorded range is reused", record: "300000:65536\n", got: other},
		{name: "recorded range, same range configured", record: "300000:65536\n", want: other, got: other},
		{name: "recorded range, another configured", record: "300000:65536\n", want: auto,
			err: "was made with uid range 300000:65536 (its templates, snapshots, volumes and sandboxes are owned by those host ids), not 1073741824:65536: start corral with --uid-range 300000:65536 or without --uid-range, or use a new --data dir"},
		{name: "legacy data dir keeps 100000", record: "db", got: legacy},
		{name: "legacy data dir, 100000 delegated", record: "db", subuid: "alice:100000:65536\n",
			err: `data dir DATA was made with uid range 100000:65536, which is not free: SUBUID line 1 "alice:100000:65536" delegates ids in it to alice`},
		{name: "legacy data dir, another range configured", record: "db", want: other, err: "was made with uid range 100000:65536"},
		{name: "garbled record", record: "lots\n", err: "want BASE or BASE:COUNT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data := t.TempDir()
			etc := t.TempDir()
			files := idrange.InDir(etc)
			if err := os.WriteFile(files.SubUID, []byte(tt.subuid), 0o644); err != nil {
				t.Fatal(err)
			}
			switch tt.record {
			case "":
			case "db":
				if err := os.WriteFile(filepath.Join(data, "corral.db"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			default:
				if err := os.WriteFile(filepath.Join(data, IDRangeFile), []byte(tt.record), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ResolveIDRange(data, tt.want, files)
			if tt.err != "" {
				msg := strings.NewReplacer("DATA", data, "SUBUID", files.SubUID).Replace(tt.err)
				if err == nil || !strings.Contains(err.Error(), msg) {
					t.Fatalf("ResolveIDRange = %v, %v; want an error containing %q", got, err, msg)
				}
				if tt.subuid != "" && !errors.Is(err, idrange.ErrNotFree) {
					t.Errorf("error does not wrap ErrNotFree: %v", err)
				}
				if b, _ := os.ReadFile(files.SubUID); string(b) != tt.subuid {
					t.Errorf("subuid changed: %q", b)
				}
				return
			}
			if err != nil || got != tt.got {
				t.Fatalf("ResolveIDRange = %v, %v; want %v", got, err, tt.got)
			}
			if b, err := os.ReadFile(filepath.Join(data, IDRangeFile)); err != nil || string(b) != tt.got.String()+"\n" {
				t.Errorf("record %q %v, want %q", b, err, tt.got.String()+"\n")
			}
			if b, _ := os.ReadFile(files.SubUID); !strings.Contains(string(b), "corral:"+tt.got.String()+"\n") {
				t.Errorf("subuid %q lacks corral's entry", b)
			}
			again, err := ResolveIDRange(data, idrange.Range{}, files)
			if err != nil || again != got {
				t.Errorf("second start: %v, %v; want %v", again, err, got)
			}
		})
	}
}
