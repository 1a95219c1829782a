package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/actor"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/volume"
	"github.com/corralhq/corral/internal/volumecontent"
)

// volumeView is a volume in the native API.
type volumeView struct {
	ID string `json:"id"`
	// Team owns the volume.
	Team      string `json:"team"`
	Name      string `json:"name"`
	SizeMB    int64  `json:"size_mb"`
	UsedBytes *int64 `json:"used_bytes,omitempty"`
	// Token is the bearer token of the volume content API (/volumecontent).
	Token     string `json:"token"`
	CreatedAt string `json:"created_at"`
}

func (s *Server) volumeView(v *store.Volume) volumeView {
	out := volumeView{ID: v.ID, Team: v.Team, Name: v.Name, SizeMB: v.SizeMB, Token: v.Token, CreatedAt: v.CreatedAt.Format(time.RFC3339Nano)}
	if used, _, err := s.vols.Usage(v); err == nil {
		out.UsedBytes = &used
	}
	return out
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name   string `json:"name"`
		SizeMB int64  `json:"size_mb"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	v, err := s.vols.Create(r.Context(), callerTeam(r), req.Name, req.SizeMB)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.volumeView(v))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.vols.List(r.Context(), scopeFrom(r.Context()).filter())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := []volumeView{}
	for _, v := range vs {
		out = append(out, s.volumeView(v))
	}
	writeJSON(w, http.StatusOK, map[string]any{"volumes": out})
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.vols.Get(r.Context(), scopeFrom(r.Context()).filter(), r.PathValue("ref"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.volumeView(v))
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.vols.Delete(r.Context(), scopeFrom(r.Context()).filter(), r.PathValue("ref")); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeContent serves E2B's volume content API (/volumecontent/{id}/...)
// with each volume's bearer token; file writes and deletions are audited
// as events of the volume's team. The token is the volume's own: the
// lookup is by the id in the path (any team's, never a name), and the
// token must be that volume's, so a token of one team's volume reaches no
// other volume.
func (s *Server) volumeContent() http.Handler {
	return volumecontent.New(func(ctx context.Context, id, token string) (string, error) {
		v, err := s.vols.Get(ctx, "", id)
		if errors.Is(err, volume.ErrNotFound) || err == nil && v.ID != id {
			return "", volumecontent.ErrNotFound
		}
		if err != nil {
			return "", err
		}
		if !sameSecret(token, v.Token) {
			return "", volumecontent.ErrUnauthorized
		}
		return s.vols.Path(ctx, v)
	}, volumecontent.Options{
		HostBase: int(s.mgr.IDBase()),
		OnWrite: func(id, path string, size int64) {
			s.recordVolumeContent(id, "volume.file_write", map[string]any{"volume": id, "path": path, "bytes": size})
		},
		OnDelete: func(id, path string) {
			s.recordVolumeContent(id, "volume.file_delete", map[string]any{"volume": id, "path": path})
		},
	})
}

// recordVolumeContent records an event of the volume content API as an
// event of volume id's team (the caller holds the volume's token, no API
// key).
func (s *Server) recordVolumeContent(id, kind string, data map[string]any) {
	if s.cfg.Audit == nil {
		return
	}
	ctx := context.Background()
	if v, err := s.vols.Get(ctx, "", id); err == nil {
		ctx = actor.With(ctx, actor.Actor{Team: v.Team})
	}
	s.cfg.Audit.RecordBy(ctx, "", kind, data)
}
