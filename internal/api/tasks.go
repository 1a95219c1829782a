package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/store"
)

// taskView is a task as the API reports it.
type taskView struct {
	ID        string            `json:"id"`
	Agent     string            `json:"agent"`
	Implicit  bool              `json:"implicit"`
	State     string            `json:"state"`
	Budgets   store.TaskBudgets `json:"budgets"`
	Usage     store.TaskUsage   `json:"usage"`
	Breaker   store.Breaker     `json:"breaker"`
	OnTrip    string            `json:"on_trip"`
	Artifacts []string          `json:"artifacts"`
	Sandboxes []string          `json:"sandboxes"`
	CreatedAt string            `json:"created_at"`
	EndedAt   *string           `json:"ended_at"`
	// Team owns the task.
	Team string `json:"team"`
}

func (s *Server) taskOut(t *store.Task) taskView {
	v := taskView{ID: t.ID, Agent: t.Agent, Implicit: t.Implicit, State: t.State, Budgets: t.Budgets, Usage: t.Usage,
		Breaker: t.Breaker, OnTrip: t.OnTrip, Artifacts: t.Artifacts, CreatedAt: ts(t.CreatedAt), Team: t.Team}
	if v.Artifacts == nil {
		v.Artifacts = []string{}
	}
	if s.gov != nil {
		v.Sandboxes = s.gov.LiveSandboxes(t.ID)
	}
	if v.Sandboxes == nil {
		v.Sandboxes = []string{}
	}
	if t.EndedAt != nil {
		e := ts(*t.EndedAt)
		v.EndedAt = &e
	}
	return v
}

// taskErr maps governor errors.
func (s *Server) taskErr(w http.ResponseWriter, r *http.Request, err error) {
	var inv *govern.InvalidError
	switch {
	case errors.As(err, &inv):
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, inv.Msg)
	case errors.Is(err, govern.ErrNoTask):
		writeError(w, http.StatusNotFound, CodeNotFound, "task not found")
	default:
		s.writeErr(w, r, err)
	}
}

func (s *Server) needGov(w http.ResponseWriter) bool {
	if s.gov == nil {
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "tasks are not enabled on this server")
		return false
	}
	return true
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) {
	var req govern.TaskRequest
	if !decodeJSON(w, r, &req) || !s.needGov(w) {
		return
	}
	req.Team = callerTeam(r)
	t, err := s.gov.Create(r.Context(), req)
	if err != nil {
		s.taskErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.taskOut(t))
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	if !s.needGov(w) {
		return
	}
	t, err := s.gov.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.taskErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.taskOut(t))
}

func (s *Server) listTasks(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	var states []string
	switch st := p.oneOf("state", "", store.TaskOpen, store.TaskTripped, store.TaskEnded, "all"); st {
	case "":
		states = []string{store.TaskOpen, store.TaskTripped}
	case "all":
	default:
		states = []string{st}
	}
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	list, err := s.store.ListTasks(r.Context(), store.TaskFilter{Team: scopeFrom(r.Context()).filter(), States: states})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]taskView, 0, len(list))
	for _, t := range list {
		out = append(out, s.taskOut(t))
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": out})
}

func (s *Server) changeTask(w http.ResponseWriter, r *http.Request) {
	var ch govern.BudgetChange
	if !decodeJSON(w, r, &ch) || !s.needGov(w) {
		return
	}
	t, err := s.gov.Change(r.Context(), r.PathValue("id"), ch)
	if err != nil {
		s.taskErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.taskOut(t))
}

func (s *Server) endTask(w http.ResponseWriter, r *http.Request) {
	if !s.needGov(w) {
		return
	}
	t, err := s.gov.EndTask(r.Context(), r.PathValue("id"))
	if err != nil {
		s.taskErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.taskOut(t))
}

func (s *Server) reportTokens(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens int64 `json:"tokens"`
	}
	if !decodeJSON(w, r, &req) || !s.needGov(w) {
		return
	}
	t, err := s.gov.ReportTokens(r.Context(), r.PathValue("id"), req.Tokens)
	if err != nil {
		s.taskErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.taskOut(t))
}

// retryAfter formats a Retry-After value in whole seconds (at least 1).
func retryAfter(sec float64) string {
	n := int(sec + 0.999)
	if n < 1 {
		n = 1
	}
	return strconv.Itoa(n)
}
