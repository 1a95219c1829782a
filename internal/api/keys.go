package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/store"
)

// keyView is what the API says about an API key: its id, never its value
// or hash.
type keyView struct {
	ID        string `json:"id"`
	Team      string `json:"team"`
	Role      string `json:"role"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
	// RevokedAt is when the key was revoked; absent for a valid key.
	RevokedAt *string `json:"revoked_at,omitempty"`
}

// newKeyView is the answer of POST /v1/keys: the record and, this once,
// the key's value.
type newKeyView struct {
	// Key is the key's value: shown only in this answer (the server
	// keeps its hash).
	Key       string `json:"key"`
	ID        string `json:"id"`
	Team      string `json:"team"`
	Role      string `json:"role"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
}

// keyRequest is the body of POST /v1/keys.
type keyRequest struct {
	Team string `json:"team"`
	Role string `json:"role"`
	Name string `json:"name"`
}

func keyOut(k *store.APIKey) keyView {
	v := keyView{ID: k.ID, Team: k.Team, Role: k.Role, Name: k.Name, CreatedAt: ts(k.CreatedAt)}
	if k.RevokedAt != nil {
		t := ts(*k.RevokedAt)
		v.RevokedAt = &t
	}
	return v
}

// createKey serves POST /v1/keys {"team","role","name"} (admin only):
// 201 with the new key's value, which no later answer shows. Role
// defaults to member. The team need not exist: a team is the set of
// records of its keys.
func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	var req keyRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Team == "" {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, "team: required (the team the key acts for)")
		return
	}
	if req.Role == "" {
		req.Role = store.RoleMember
	}
	key, k, err := s.store.CreateAPIKey(r.Context(), req.Name, req.Team, req.Role)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.auditChange(r.Context(), "key.created", map[string]any{"key_id": k.ID, "team": k.Team, "role": k.Role, "name": k.Name})
	writeJSON(w, http.StatusCreated, newKeyView{Key: key, ID: k.ID, Team: k.Team, Role: k.Role, Name: k.Name, CreatedAt: ts(k.CreatedAt)})
}

// listKeys serves GET /v1/keys[?team=NAME|all] (admin only): the keys of
// the request's scope (the caller's team unless it asks with ?team=),
// revoked ones too, never a value or hash.
func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.ListAPIKeys(r.Context(), scopeFrom(r.Context()).filter())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]keyView, 0, len(list))
	for _, k := range list {
		out = append(out, keyOut(k))
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

// revokeKey serves DELETE /v1/keys/{id} (admin only): the key fails from
// its next request on (nothing caches keys). Revoking a revoked key
// answers its record again; an unknown id is 404; the server's last
// unrevoked admin key is refused with 409 conflict, so the server always
// keeps an admin. Any team's key may be revoked by id, whatever the
// request's ?team=: an admin acts for the whole server.
func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	k, revoked, err := s.store.RevokeAPIKey(r.Context(), r.PathValue("id"), time.Now())
	if err == nil {
		if revoked {
			s.auditChange(r.Context(), "key.revoked", map[string]any{"key_id": k.ID, "team": k.Team, "role": k.Role, "name": k.Name})
		}
		writeJSON(w, http.StatusOK, keyOut(k))
		return
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, "API key not found")
	case errors.Is(err, store.ErrLastAdminKey):
		writeError(w, http.StatusConflict, CodeConflict, "cannot revoke the key: "+store.ErrLastAdminKey.Error())
	default:
		s.writeErr(w, r, err)
	}
}
