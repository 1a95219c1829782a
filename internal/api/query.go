package api

import (
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corralhq/corral/internal/safetext"
)

// MaxParamLen bounds the value of one query parameter, in bytes.
const MaxParamLen = 1024

// maxUnixSeconds is the largest unix time a parameter may name (the end
// of year 9999, the largest RFC 3339 can write).
const maxUnixSeconds = 253402300799

// ParamError is a query parameter refused: unknown to a native route,
// given more than once, or with a value the route does not accept. It is
// answered 400 invalid_argument (E2B routes: E2B's {"code": 400}), and
// its message names the parameter and what it accepts.
type ParamError struct {
	// Name is the parameter.
	Name string
	// Msg says what the route accepts.
	Msg string
}

func (e *ParamError) Error() string { return "query parameter " + e.Name + ": " + e.Msg }

// routeParams lists, per route pattern, the query parameters its handler
// reads, besides team (every API-key route's scope, scopeFor). A name
// ending in "." is a prefix (metadata.KEY). It is the one list the
// parameter check (checkParams) and the reader (params) go by; a route
// not in it takes no parameter but team.
var routeParams = map[string][]string{
	"GET /v1/sandboxes":               {"state", "metadata."},
	"GET /v1/sandboxes/{id}/metrics":  {"since"},
	"GET /v1/audit":                   {"sandbox", "task", "kind", "since", "until", "after", "limit", "format"},
	"GET /v1/events/stream":           {"sandbox", "task", "kind", "after"},
	"GET /v1/snapshots":               {"sandbox", "name"},
	"GET /v1/tasks":                   {"state"},
	"GET /v1/templates":               {"name"},
	"GET /v1/templates/{ref}/inspect": {"top"},
	"POST /v1/templates/builds":       {"publish"},
	"POST /v1/templates/import":       {"ref", "publish"},
	"GET /v1/tools":                   {"format"},
	"GET /v1/usage":                   {"since", "until", "by"},
	"GET /sandboxes":                  e2bListParams,
	"GET /v2/sandboxes":               e2bListParams,
	"GET /sandboxes/{id}/metrics":     {"start", "end"},
	"GET /snapshots":                  {"sandboxID", "name", "limit", "nextToken"},
}

// e2bListParams are the parameters of E2B's sandbox list (v1 and v2).
var e2bListParams = []string{"metadata", "state", "startedAfter", "limit", "nextToken", "template", "order"}

// passthroughParams are the routes whose query belongs to the sandbox's
// agent (its /files?path=&username=, say): the API reads only team and
// checks nothing else.
var passthroughParams = map[string]bool{"/v1/sandboxes/{id}/agent/": true}

// declared reports whether route pattern reads parameter name.
func declared(pattern, name string) bool {
	if name == "team" {
		return true
	}
	for _, p := range routeParams[pattern] {
		if prefix, ok := strings.CutSuffix(p, "."); ok {
			if key, ok := strings.CutPrefix(name, prefix+"."); ok && key != "" {
				return true
			}
		} else if p == name {
			return true
		}
	}
	return false
}

// checkParams is the check every API-key route's query goes through
// (authenticate), before the handler acts. It defends against a request
// whose parameters the server would otherwise misread or ignore — a
// misspelt filter that lists everything, a limit given twice, a NUL or a
// megabyte in a filter value: a parameter the route reads must appear
// once, with at most MaxParamLen bytes of UTF-8 without control
// characters; with strict (native routes) a parameter the route does not
// read is refused too, as unknown JSON fields are. E2B routes ignore
// unknown parameters, as E2B's API does.
func checkParams(r *http.Request, strict bool) error {
	if passthroughParams[r.Pattern] {
		return nil
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return &ParamError{Name: "(query)", Msg: "malformed query string: " + err.Error()}
	}
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	slices.Sort(names) // the first refusal named does not depend on map order
	for _, name := range names {
		if !declared(r.Pattern, name) {
			if strict {
				return &ParamError{Name: quoteName(name), Msg: "unknown parameter for " + r.Method + " " + routeName(r.Pattern) + acceptedList(r.Pattern)}
			}
			continue
		}
		vs := q[name]
		if len(vs) > 1 {
			return &ParamError{Name: quoteName(name), Msg: "given more than once"}
		}
		if msg := badText(vs[0]); msg != "" {
			return &ParamError{Name: quoteName(name), Msg: msg}
		}
	}
	return nil
}

// badText says what is wrong with a parameter value, or "".
func badText(v string) string {
	if len(v) > MaxParamLen {
		return fmt.Sprintf("longer than %d bytes", MaxParamLen)
	}
	if !utf8.ValidString(v) {
		return "not valid UTF-8"
	}
	if !safetext.Clean(v, false) {
		return "contains a control character"
	}
	return ""
}

// quoteName is a parameter name fit for a message: as given when short
// and printable, quoted and cut otherwise.
func quoteName(name string) string {
	if len(name) <= 64 && badText(name) == "" {
		return name
	}
	if len(name) > 64 {
		name = name[:64]
	}
	return strconv.Quote(name)
}

// routeName is the path part of a route pattern.
func routeName(pattern string) string {
	if _, path, ok := strings.Cut(pattern, " "); ok {
		return path
	}
	return pattern
}

// acceptedList names the parameters a route reads, for a refusal.
func acceptedList(pattern string) string {
	names := append([]string{}, routeParams[pattern]...)
	for i, n := range names {
		if strings.HasSuffix(n, ".") {
			names[i] = n + "KEY"
		}
	}
	names = append(names, "team")
	return " (it accepts " + strings.Join(names, ", ") + ")"
}

// params reads the values of a request's query parameters, each by the
// rule of its kind (one rule per kind, for every route): the first value
// refused is kept as a *ParamError, which err returns, and the handler
// answers it before it acts. checkParams has already refused unknown,
// repeated and unprintable parameters.
type params struct {
	q     url.Values
	first error
}

// paramsOf returns the reader of r's query.
func paramsOf(r *http.Request) *params { return &params{q: r.URL.Query()} }

// err is the first refusal, or nil.
func (p *params) err() error { return p.first }

func (p *params) refuse(name, format string, args ...any) {
	if p.first == nil {
		p.first = &ParamError{Name: name, Msg: fmt.Sprintf(format, args...)}
	}
}

// got quotes a refused value (cut to 64 bytes) for a message.
func got(v string) string {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return strconv.Quote(v)
}

// str returns a parameter's value ("" when absent).
func (p *params) str(name string) string { return p.q.Get(name) }

// prefixed returns the parameters named prefix+KEY as KEY → value.
func (p *params) prefixed(prefix string) map[string]string {
	out := map[string]string{}
	for k, vs := range p.q {
		if key, ok := strings.CutPrefix(k, prefix); ok && key != "" && len(vs) > 0 {
			out[key] = vs[0]
		}
	}
	return out
}

// integer returns a parameter's value, a decimal integer in lo..hi, and
// whether it was given; def when it was not.
func (p *params) integer(name string, def, lo, hi int64) (int64, bool) {
	v := p.q.Get(name)
	if v == "" {
		return def, false
	}
	n, err := parseInteger(v, lo, hi)
	if err != nil {
		p.refuse(name, "%s (got %s)", err, got(v))
		return def, false
	}
	return n, true
}

// parseInteger parses a decimal integer in lo..hi (digits and a leading
// minus only: no "+", no spaces, no hex), the rule of every integer
// parameter and of Last-Event-ID.
func parseInteger(v string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || strings.HasPrefix(v, "+") || n < lo || n > hi {
		return 0, fmt.Errorf("must be an integer from %d to %s", lo, limitText(hi))
	}
	return n, nil
}

func limitText(hi int64) string {
	if hi == math.MaxInt64 {
		return strconv.FormatInt(hi, 10) + " (2^63-1)"
	}
	return strconv.FormatInt(hi, 10)
}

// instant returns a parameter's value, an RFC 3339 time (zero when
// absent).
func (p *params) instant(name string) time.Time {
	v := p.q.Get(name)
	if v == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		p.refuse(name, "must be an RFC 3339 time such as 2026-01-02T15:04:05Z (got %s)", got(v))
	}
	return t
}

// when returns a parameter's value, an RFC 3339 time or a positive Go
// duration back from now (1h, 90m); zero when absent.
func (p *params) when(name string, now time.Time) time.Time {
	v := p.q.Get(name)
	if v == "" {
		return time.Time{}
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			p.refuse(name, "a duration back from now must not be negative (got %s)", got(v))
			return time.Time{}
		}
		return now.Add(-d)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		p.refuse(name, "must be an RFC 3339 time or a positive duration back from now such as 1h (got %s)", got(v))
	}
	return t
}

// oneOf returns a parameter's value, one of allowed; def when absent.
func (p *params) oneOf(name, def string, allowed ...string) string {
	v := p.q.Get(name)
	if v == "" {
		return def
	}
	if !slices.Contains(allowed, v) {
		p.refuse(name, "must be %s (got %s)", strings.Join(allowed, ", "), got(v))
		return def
	}
	return v
}

// listOf returns a parameter's comma-separated values, each one of
// allowed (nil when absent).
func (p *params) listOf(name string, allowed ...string) []string {
	v := p.q.Get(name)
	if v == "" {
		return nil
	}
	var out []string
	for _, e := range strings.Split(v, ",") {
		if !slices.Contains(allowed, e) {
			p.refuse(name, "must be a comma-separated list of %s (got %s)", strings.Join(allowed, ", "), got(v))
			return nil
		}
		out = append(out, e)
	}
	return out
}

// boolean returns a parameter's value, true or false (false when absent).
func (p *params) boolean(name string) bool { return p.oneOf(name, "false", "true", "false") == "true" }

// offsetToken returns the offset a page token (offsetTokenOf) names, 0
// when absent. A token the server did not write is refused.
func (p *params) offsetToken(name string) int {
	v := p.q.Get(name)
	if v == "" {
		return 0
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	n, aerr := strconv.Atoi(string(b))
	if err != nil || aerr != nil || n < 0 || offsetTokenOf(n) != v {
		p.refuse(name, "must be a token from a previous page's X-Next-Token (got %s)", got(v))
		return 0
	}
	return n
}

// offsetTokenOf is the page token of an offset.
func offsetTokenOf(n int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(n)))
}
