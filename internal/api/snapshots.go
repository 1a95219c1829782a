package api

import (
	"errors"
	"net/http"
	"slices"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// snapshotView is a snapshot as the native API reports it.
type snapshotView struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Sandbox   string `json:"sandbox"`
	Template  string `json:"template"`
	Parent    string `json:"parent"`
	Layers    int    `json:"layers"`
	SizeBytes int64  `json:"size_bytes"`
	CreatedAt string `json:"created_at"`
	// Team owns the snapshot.
	Team string `json:"team"`
}

// forkView is the answer to a fork: the snapshot, the sandboxes started
// from it and, when only some of them started, why the others did not.
type forkView struct {
	Snapshot  snapshotView  `json:"snapshot"`
	Sandboxes []sandboxView `json:"sandboxes"`
	Error     string        `json:"error,omitempty"`
}

func snapshotOut(sn *store.Snapshot) snapshotView {
	return snapshotView{ID: sn.ID, Name: sn.Name, Sandbox: sn.SandboxID, Template: sn.Template, Parent: sn.Parent,
		Layers: len(sn.Layers), SizeBytes: sn.SizeBytes, CreatedAt: ts(sn.CreatedAt), Team: sn.Team}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if r.ContentLength != 0 && !decodeJSON(w, r, &req) {
		return
	}
	sn, err := s.mgr.Snapshot(r.Context(), r.PathValue("id"), req.Name)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotOut(sn))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	list, err := s.store.ListSnapshots(r.Context(), store.SnapshotFilter{Team: scopeFrom(r.Context()).filter(),
		SandboxID: p.str("sandbox"), Name: p.str("name")})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]snapshotView, 0, len(list))
	for _, sn := range list {
		out = append(out, snapshotOut(sn))
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": out})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.store.GetSnapshot(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, "snapshot not found")
		return
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotOut(sn))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	err := s.mgr.DeleteSnapshot(r.Context(), r.PathValue("id"))
	if errors.Is(err, sandbox.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, "snapshot not found")
		return
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count   int    `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if r.ContentLength != 0 && !decodeJSON(w, r, &req) {
		return
	}
	if req.Count == 0 {
		req.Count = 1
	}
	sbs, sn, err := s.mgr.Fork(r.Context(), r.PathValue("id"), req.Count, req.Timeout)
	if err != nil && len(sbs) == 0 {
		s.writeErr(w, r, err)
		return
	}
	out := forkView{Snapshot: snapshotOut(sn), Sandboxes: make([]sandboxView, 0, len(sbs))}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, view(sb))
	}
	if err != nil {
		out.Error = err.Error()
	}
	writeJSON(w, http.StatusCreated, out)
}

// e2bCreateSnapshot serves POST /sandboxes/{id}/snapshots.
func (s *Server) e2bCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if !e2bBody(w, r, &req) {
		return
	}
	sb, ok := s.e2bRunning(w, r)
	if !ok {
		return
	}
	sn, err := s.mgr.Snapshot(r.Context(), sb.ID, req.Name)
	if err != nil {
		var inv *sandbox.InvalidError
		if errors.As(err, &inv) {
			e2bError(w, http.StatusBadRequest, inv.Msg)
			return
		}
		s.e2bStateErr(w, r, sb.ID, err, "the sandbox's state does not allow a snapshot")
		return
	}
	writeJSON(w, http.StatusCreated, e2bSnapshotOut(sn))
}

func e2bSnapshotOut(sn *store.Snapshot) map[string]any {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return map[string]any{"snapshotID": sn.ID, "names": names, "sandboxID": sn.SandboxID, "templateID": sn.Template,
		"createdAt": ts(sn.CreatedAt), "sizeBytes": sn.SizeBytes}
}

// MaxE2BSnapshotPage is the largest ?limit= of E2B's GET /snapshots.
const MaxE2BSnapshotPage = 1000

// e2bListSnapshots serves GET /snapshots?sandboxID=&name=&limit=&nextToken=.
func (s *Server) e2bListSnapshots(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	limit, _ := p.integer("limit", 100, 1, MaxE2BSnapshotPage)
	token := p.str("nextToken")
	if err := p.err(); err != nil {
		s.e2bWriteErr(w, r, err)
		return
	}
	list, err := s.store.ListSnapshots(r.Context(), store.SnapshotFilter{Team: scopeFrom(r.Context()).filter(),
		SandboxID: p.str("sandboxID"), Name: p.str("name")})
	if err != nil {
		s.e2bWriteErr(w, r, err)
		return
	}
	start := 0
	if token != "" {
		// The token is the id of the next page's first snapshot: one
		// that is not in the listing (deleted since, or never written by
		// the server) is refused rather than restarting at the top.
		start = slices.IndexFunc(list, func(sn *store.Snapshot) bool { return sn.ID == token })
		if start < 0 {
			s.e2bWriteErr(w, r, &ParamError{Name: "nextToken", Msg: "names no snapshot of this listing (it was deleted, or is not a token from X-Next-Token); list again from the first page"})
			return
		}
	}
	end := min(start+int(limit), len(list))
	if end < len(list) {
		w.Header().Set("X-Next-Token", list[end].ID)
	}
	out := []map[string]any{}
	for _, sn := range list[start:end] {
		out = append(out, e2bSnapshotOut(sn))
	}
	writeJSON(w, http.StatusOK, out)
}

// e2bDeleteTemplate serves DELETE /templates/{id}: snapshots are E2B
// templates; corral's own templates are not deletable this way.
func (s *Server) e2bDeleteTemplate(w http.ResponseWriter, r *http.Request) {
	err := s.mgr.DeleteSnapshot(r.Context(), r.PathValue("id"))
	var conflict *sandbox.ConflictError
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, sandbox.ErrNotFound):
		e2bError(w, http.StatusNotFound, "template "+r.PathValue("id")+" not found")
	case errors.As(err, &conflict):
		e2bError(w, http.StatusConflict, conflict.Msg)
	default:
		s.e2bWriteErr(w, r, err)
	}
}

// e2bTemplateAlias serves GET /templates/aliases/{alias} (Template.exists):
// 200 when a template of that name (or name:version) exists, else 404.
func (s *Server) e2bTemplateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	if s.templateVisible(r, alias, false) != nil {
		e2bError(w, http.StatusNotFound, "template "+alias+" not found")
		return
	}
	if _, err := s.templates.Resolve(r.Context(), alias); err == nil {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": false})
		return
	}
	if list, err := s.templates.List(r.Context(), alias); err == nil && len(list) > 0 {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": false})
		return
	}
	e2bError(w, http.StatusNotFound, "template "+alias+" not found")
}

// e2bFork serves POST /sandboxes/{id}/fork: [{"sandbox": Sandbox}].
func (s *Server) e2bFork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count   int    `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !e2bBody(w, r, &req) {
		return
	}
	if req.Count == 0 {
		req.Count = 1
	}
	sbs, _, err := s.mgr.Fork(r.Context(), r.PathValue("id"), req.Count, req.Timeout)
	if errors.Is(err, sandbox.ErrNotFound) {
		e2bError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return
	}
	// No fork started: the whole call fails as every E2B route does
	// (e2bWriteErr: 400, 429 with Retry-After, 501 on a driver without
	// snapshots, 500 only for the unexpected).
	if err != nil && len(sbs) == 0 {
		s.e2bWriteErr(w, r, err)
		return
	}
	out := []map[string]any{}
	for _, sb := range sbs {
		out = append(out, map[string]any{"sandbox": e2bSandboxOf(sb)})
	}
	if err != nil {
		// Some forks started: the failure is the last entry, with the
		// status and message classify gives (no host path reaches it).
		f := classify(err)
		if f.internalError {
			s.log.Error("e2b fork", "id", r.PathValue("id"), "err", err)
		}
		out = append(out, map[string]any{"error": map[string]any{"code": f.status, "message": f.msg}})
	}
	writeJSON(w, http.StatusCreated, out)
}
