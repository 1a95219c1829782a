package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"

	"strings"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
	"github.com/corralhq/corral/internal/template/registry"
)

// templateView is a template version as the API reports it.
type templateView struct {
	Name      string               `json:"name"`
	Version   string               `json:"version"`
	Ref       string               `json:"ref"`
	Digest    string               `json:"digest"`
	Parent    string               `json:"parent"`
	Source    string               `json:"source"`
	SizeBytes int64                `json:"size_bytes"`
	Layers    int                  `json:"layers"`
	Current   bool                 `json:"current"`
	Config    store.TemplateConfig `json:"config"`
	CreatedAt string               `json:"created_at"`
	// Team is the one team that may use the template; "" when it is
	// published for every team.
	Team string `json:"team"`
}

// importView is the answer to an import: the new version and the
// import's log.
type importView struct {
	Template templateView `json:"template"`
	Log      string       `json:"log"`
}

func templateOut(t *store.TemplateVersion) templateView {
	return templateView{Name: t.Name, Version: t.Version, Ref: t.Ref(), Digest: t.Digest, Parent: t.Parent, Source: t.Source,
		SizeBytes: t.SizeBytes, Layers: 1 + len(t.Layers), Current: t.Current, Config: t.Config, CreatedAt: ts(t.CreatedAt), Team: t.Team}
}

func (s *Server) templateErr(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, registry.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, "template not found")
		return
	}
	s.writeErr(w, r, err)
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	list, err := s.templates.List(r.Context(), paramsOf(r).str("name"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	sc := scopeFrom(r.Context())
	out := make([]templateView, 0, len(list))
	for _, t := range list {
		if t.Team == "" || sc.sees(t.Team) {
			out = append(out, templateOut(t))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.templates.Resolve(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.templateErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t))
}

func (s *Server) useTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.templates.Use(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.templateErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t))
}

// publishTemplate serves POST /v1/templates/{ref}/publish (admin only):
// every version of the template's name becomes usable by every team.
func (s *Server) publishTemplate(w http.ResponseWriter, r *http.Request) {
	name, _ := registry.SplitRef(r.PathValue("ref"))
	if err := s.templates.Publish(r.Context(), name); err != nil {
		s.templateErr(w, r, err)
		return
	}
	s.auditChange(r.Context(), "template.published", map[string]any{"template": name})
	t, err := s.templates.Resolve(r.Context(), name)
	if err != nil {
		s.templateErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t))
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.templates.Delete(r.Context(), r.PathValue("ref")); err != nil {
		s.templateErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildTemplate serves POST /v1/templates/builds: the body is a
// TemplateSpec; the answer streams JSON Lines: {"log": "..."} per line of
// progress, then {"template": {...}} or {"error": {"code", "message"}}.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	var spec registry.Spec
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, registry.MaxSpecFileBytes*2))
	if err == nil {
		err = parseJSON(data, &spec, true)
	}
	if err != nil {
		f := bodyFailure(err)
		writeError(w, f.status, f.code, f.msg)
		return
	}
	team, err := newTemplateTeam(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	spec.Team = team
	// A spec that cannot be built is refused before the stream starts
	// (400 invalid_argument, not a 200 stream that carries the error).
	if err := spec.Check(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/jsonl")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	emit := func(v any) {
		_ = enc.Encode(v)
		_ = rc.Flush()
	}
	tv, err := s.mgr.BuildTemplate(r.Context(), spec, func(line string) { emit(map[string]string{"log": line}) })
	if err != nil {
		code := CodeInternal
		var inv *sandbox.InvalidError
		var conflict *sandbox.ConflictError
		var rinv *registry.InvalidError
		var rconflict *registry.ConflictError
		var be *sandbox.BuildError
		switch {
		case errors.As(err, &inv), errors.As(err, &rinv):
			code = CodeInvalidArgument
		case errors.As(err, &conflict), errors.As(err, &rconflict):
			code = CodeConflict
		case errors.As(err, &be):
			code = "build_failed"
		default:
			s.log.Error("template build", "err", err)
		}
		emit(map[string]any{"error": apiError{Code: code, Message: err.Error()}})
		return
	}
	emit(map[string]any{"template": templateOut(tv)})
}

// saveTemplate serves POST /v1/sandboxes/{id}/template {"ref": "name:version"}.
func (s *Server) saveTemplate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Ref string `json:"ref"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	tv, err := s.mgr.SaveTemplate(r.Context(), r.PathValue("id"), req.Ref)
	if err != nil {
		s.templateErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, templateOut(tv))
}

// MaxImportBytes bounds an uploaded image tarball.
const MaxImportBytes = 8 << 30

// importTemplate serves POST /v1/templates/import?ref=NAME:VERSION. The
// body is a `docker save` / OCI image tarball (Content-Type
// application/x-tar), or JSON {"image": REF, "insecure": bool} to pull from
// a registry, or {"layout": DIR} for an OCI layout directory on the
// server's host.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) {
	// The team first: a refused ?publish= reads no upload.
	team, err := newTemplateTeam(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	ref := paramsOf(r).str("ref")
	var src template.ImportSource
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		var req struct {
			Ref      string `json:"ref"`
			Image    string `json:"image"`
			Insecure bool   `json:"insecure"`
			Layout   string `json:"layout"`
		}
		if !decodeJSON(w, r, &req) {
			return
		}
		if req.Ref != "" {
			ref = req.Ref
		}
		src = template.ImportSource{Ref: req.Image, Insecure: req.Insecure, Layout: req.Layout}
		if (req.Image == "") == (req.Layout == "") {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "give image (a registry reference) or layout (a directory on the server)")
			return
		}
	} else {
		tmp, err := os.CreateTemp("", "corral-import-*.tar")
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		defer os.Remove(tmp.Name())
		_, err = io.Copy(tmp, http.MaxBytesReader(w, r.Body, MaxImportBytes))
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "reading the image tarball: "+err.Error())
			return
		}
		src = template.ImportSource{Tarball: tmp.Name()}
	}
	var log strings.Builder
	tv, err := s.templates.Import(r.Context(), ref, team, src, &log)
	if err != nil {
		s.templateErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, importView{Template: templateOut(tv), Log: log.String()})
}

// inspectTemplate serves GET /v1/templates/{ref}/inspect?top=N: size by
// layer and each layer's largest files.
func (s *Server) inspectTemplate(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	n, _ := p.integer("top", 20, 1, 1000)
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	layers, image, err := s.templates.Inspect(r.Context(), r.PathValue("ref"), int(n))
	if err != nil {
		s.templateErr(w, r, err)
		return
	}
	if image == nil {
		image = []template.LayerInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"layers": layers, "image_layers": image})
}
