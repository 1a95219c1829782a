package api

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// networkView is a sandbox's network policy and egress counters.
type networkView struct {
	Mode    string     `json:"mode"`
	Allow   []string   `json:"allow"`
	Secrets []string   `json:"secrets"`
	Usage   *usageView `json:"usage,omitempty"`
}

// usageView are a sandbox's egress counters.
type usageView struct {
	Conns    int   `json:"conns"`
	Bytes    int64 `json:"bytes"`
	Requests int   `json:"requests"`
}

func (s *Server) networkOf(sb *store.Sandbox) networkView {
	v := networkView{Mode: sb.Network, Allow: sb.Egress.Allow, Secrets: sb.Egress.Secrets}
	if v.Allow == nil {
		v.Allow = []string{}
	}
	if v.Secrets == nil {
		v.Secrets = []string{}
	}
	if u, ok := s.mgr.NetworkUsage(sb.ID); ok {
		v.Usage = &usageView{Conns: u.Conns, Bytes: u.Bytes, Requests: u.Requests}
	}
	return v
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.networkOf(sb))
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var req sandbox.NetworkRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	sb, err := s.mgr.SetNetwork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.networkOf(sb))
}

// secretView is what the API says about a secret: never its value.
type secretView struct {
	// Team owns the secret; only its sandboxes may use it.
	Team      string   `json:"team"`
	Name      string   `json:"name"`
	Hosts     []string `json:"hosts"`
	Header    string   `json:"header"`
	AllowHTTP bool     `json:"allow_http"`
	CreatedAt string   `json:"created_at"`
	UpdatedAt string   `json:"updated_at"`
}

// Secret limits.
const (
	maxSecretHosts  = 32
	maxSecretValue  = 8 << 10
	maxSecretHeader = 128
)

// putSecret creates or replaces a secret of the caller's own team. A
// secret of that name in another team is neither touched nor mentioned:
// names are per team.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	team := callerTeam(r)
	var req struct {
		Hosts  []string `json:"hosts"`
		Header string   `json:"header"`
		Value  string   `json:"value"`
		// AllowHTTP lets the proxy inject the value into plain HTTP;
		// absent means false (over TLS only).
		AllowHTTP bool `json:"allow_http"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	if err := egress.ValidSecretName(name); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, "secret name: "+err.Error())
		return
	}
	if msg := checkSecret(req.Hosts, req.Header, req.Value); msg != "" {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, msg)
		return
	}
	if s.cfg.Redactor != nil {
		if err := s.cfg.Redactor.AddFor(team, name, req.Value); err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidArgument, "secret value: "+err.Error())
			return
		}
	}
	sec := &store.Secret{Team: team, Name: name, Hosts: req.Hosts, Header: req.Header, Value: req.Value, AllowHTTP: req.AllowHTTP}
	if err := s.store.PutSecret(r.Context(), sec); err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.mgr.RefreshSecrets(r.Context(), team, name)
	s.auditChange(r.Context(), "secret.set", map[string]any{"name": name, "hosts": req.Hosts, "header": req.Header, "allow_http": req.AllowHTTP})
	got, err := s.store.GetSecret(r.Context(), team, name)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOut(got))
}

// oneTeam is the one team a route that names a record by its per-team
// name (a secret, a pool) acts on: the request's scope. An admin's
// ?team=all names no one team, so it is refused (400 invalid_argument)
// rather than guessed; what is the caller's to fix is said.
func oneTeam(w http.ResponseWriter, r *http.Request, what string) (string, bool) {
	team := scopeFrom(r.Context()).filter()
	if team == "" {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, what+" names are per team: name one team with ?team=TEAM, not ?team="+AllTeams)
		return "", false
	}
	return team, true
}

// checkSecret validates a secret's fields; "" means valid.
func checkSecret(hosts []string, header, value string) string {
	if len(hosts) == 0 || len(hosts) > maxSecretHosts {
		return "hosts: give 1 to " + strconv.Itoa(maxSecretHosts) + " host names or *.suffix patterns"
	}
	for _, h := range hosts {
		if _, err := egress.ParsePolicy("allow", []string{h}); err != nil || strings.Contains(h, "/") || strings.Count(h, ":") > 0 {
			return "hosts: " + strconv.Quote(h) + " is not a host name or *.suffix pattern"
		}
	}
	if header == "" || len(header) > maxSecretHeader || !headerToken(header) {
		return "header: give an HTTP header name such as Authorization"
	}
	if len(value) < egress.MinSecretLen || len(value) > maxSecretValue {
		return "value: must be " + strconv.Itoa(egress.MinSecretLen) + " to " + strconv.Itoa(maxSecretValue) + " bytes"
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return "value: must not contain line breaks or NUL"
	}
	return ""
}

// headerToken reports whether name is an HTTP field name (RFC 9110 token:
// letters, digits and !#$%&'*+-.^_`|~). It defends against a secret's
// header with a NUL, a space or a separator, which the egress proxy would
// write into requests as it is (a header another server splits or
// reads differently), or refuse at every use instead of once here.
func headerToken(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func secretOut(sec *store.Secret) secretView {
	hosts := sec.Hosts
	if hosts == nil {
		hosts = []string{}
	}
	return secretView{Team: sec.Team, Name: sec.Name, Hosts: hosts, Header: sec.Header, AllowHTTP: sec.AllowHTTP, CreatedAt: ts(sec.CreatedAt), UpdatedAt: ts(sec.UpdatedAt)}
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.ListSecrets(r.Context(), scopeFrom(r.Context()).filter())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]secretView, 0, len(list))
	for _, sec := range list {
		out = append(out, secretOut(sec))
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": out})
}

// deleteSecret deletes a secret of the request's scope: the caller's
// team, or the one team an admin names with ?team=. Another team's secret
// answers exactly as a missing one.
func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	team, ok := oneTeam(w, r, "secret")
	if !ok {
		return
	}
	err := s.store.DeleteSecret(r.Context(), team, name)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, CodeNotFound, "secret not found")
		return
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// The redactor keeps the value: it may still appear in logs of
	// requests made before the delete.
	s.mgr.RefreshSecrets(r.Context(), team, name)
	s.auditChange(r.Context(), "secret.deleted", map[string]any{"name": name, "team": team})
	w.WriteHeader(http.StatusNoContent)
}

// MaxAuditLimit is the largest ?limit= of GET /v1/audit.
const MaxAuditLimit = 10000

// listAudit serves GET /v1/audit?task=&sandbox=&kind=&since=&until=&after=&limit=
// as {"events": [...]}, or as JSON Lines with format=jsonl.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	p := paramsOf(r)
	// A team sees its own events only; server events (no team) only an
	// admin's ?team=all.
	f := store.EventFilter{Team: scopeFrom(r.Context()).filter(), SandboxID: p.str("sandbox"), TaskID: p.str("task"), Kind: p.str("kind"),
		Since: p.instant("since"), Until: p.instant("until")}
	f.AfterID, _ = p.integer("after", 0, 0, math.MaxInt64)
	limit, _ := p.integer("limit", 0, 1, MaxAuditLimit)
	f.Limit = int(limit)
	jsonl := p.oneOf("format", "json", "json", "jsonl") == "jsonl"
	if err := p.err(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if s.cfg.Audit != nil {
		s.cfg.Audit.Sync()
	}
	evs, lerr := s.store.ListEvents(r.Context(), f)
	if lerr != nil {
		s.writeErr(w, r, lerr)
		return
	}
	if evs == nil {
		evs = []*store.Event{}
	}
	if jsonl {
		w.Header().Set("Content-Type", "application/jsonl")
		for _, ev := range evs {
			b, _ := json.Marshal(ev)
			w.Write(append(b, '\n'))
		}
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": evs})
}
