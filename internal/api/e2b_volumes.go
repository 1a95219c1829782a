package api

import (
	"errors"
	"net/http"

	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/volume"
)

// E2B's volume control routes (POST/GET /volumes, GET/DELETE
// /volumes/{id}); the content routes are /volumecontent/ (volumecontent
// package). Volumes are corral volumes of the default size.

// e2bVolumeAndToken is E2B's VolumeAndToken; Volume is the same without
// the token.
type e2bVolumeAndToken struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

func (s *Server) e2bVolumeErr(w http.ResponseWriter, r *http.Request, err error) {
	var inv *volume.InvalidError
	var conflict *volume.ConflictError
	switch {
	case errors.As(err, &inv):
		e2bError(w, http.StatusBadRequest, inv.Msg)
	case errors.As(err, &conflict):
		e2bError(w, http.StatusConflict, conflict.Msg)
	case errors.Is(err, volume.ErrNotFound):
		e2bError(w, http.StatusNotFound, "volume not found")
	case errors.Is(err, volume.ErrUnavailable):
		e2bError(w, http.StatusServiceUnavailable, err.Error())
	default:
		s.e2bWriteErr(w, r, err)
	}
}

func e2bVolumeOf(v *store.Volume, withToken bool) e2bVolumeAndToken {
	out := e2bVolumeAndToken{VolumeID: v.ID, Name: v.Name}
	if withToken {
		out.Token = v.Token
	}
	return out
}

func (s *Server) e2bCreateVolume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if !e2bBody(w, r, &req) {
		return
	}
	v, err := s.vols.Create(r.Context(), callerTeam(r), req.Name, 0)
	if err != nil {
		s.e2bVolumeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, e2bVolumeOf(v, true))
}

func (s *Server) e2bListVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.vols.List(r.Context(), scopeFrom(r.Context()).filter())
	if err != nil {
		s.e2bVolumeErr(w, r, err)
		return
	}
	out := []e2bVolumeAndToken{}
	for _, v := range vs {
		out = append(out, e2bVolumeOf(v, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) e2bGetVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.vols.Get(r.Context(), scopeFrom(r.Context()).filter(), r.PathValue("id"))
	if err != nil {
		s.e2bVolumeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e2bVolumeOf(v, true))
}

func (s *Server) e2bDeleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.vols.Delete(r.Context(), scopeFrom(r.Context()).filter(), r.PathValue("id")); err != nil {
		s.e2bVolumeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
