package egress

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
)

// MinSecretLen is the shortest secret value a [Redactor] accepts; shorter
// values would match ordinary text too often.
const MinSecretLen = 8

// Redactor removes registered secret values from text. It defends against
// threat-model.md #20 (secrets readable by the agent or an operator): a brokered
// secret must never appear in logs, audit events or API responses, so every
// log line (through [NewSlogHandler]) and every stored event passes through
// Redact before it is written.
//
// Each occurrence of a value, of its standard and URL-safe base64 encodings
// and of its URL-encoded forms (query and path escaping) is replaced with
// "[REDACTED:<name>]". Overlapping occurrences of different secrets are
// covered as one span. An encoding of a value inside a longer encoded string
// (e.g. base64 of "user:value" in a Basic auth header) is not recognized;
// register the full header value as its own secret for that.
//
// A Redactor is safe for concurrent use. The zero value is ready to use.
type Redactor struct {
	mu      sync.RWMutex
	secrets map[secretKey]string // (owner, name) -> value
	pats    []pattern            // longest first
}

// secretKey names a registered secret: its owner (a team, "" for none)
// and its name. Names are per owner, so two teams' secrets of one name
// are two entries and one never displaces the other's value.
type secretKey struct{ owner, name string }

type pattern struct {
	text string
	name string
}

// marker is the replacement text for the secret called name.
func marker(name string) string { return "[REDACTED:" + name + "]" }

// forms returns the value and its encodings, deduplicated.
func forms(v string) []string {
	b := []byte(v)
	cands := []string{
		v,
		base64.StdEncoding.EncodeToString(b),
		base64.RawStdEncoding.EncodeToString(b),
		base64.URLEncoding.EncodeToString(b),
		base64.RawURLEncoding.EncodeToString(b),
		url.QueryEscape(v),
		url.PathEscape(v),
	}
	// Percent-encoding is case-insensitive in its hex digits.
	cands = append(cands, lowerPercent(url.QueryEscape(v)), lowerPercent(url.PathEscape(v)))
	seen := map[string]bool{}
	var out []string
	for _, c := range cands {
		if c != "" && !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}

// lowerPercent lower-cases the two hex digits after every '%'.
func lowerPercent(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1] = lowerASCII(b[i+1])
			b[i+2] = lowerASCII(b[i+2])
		}
	}
	return string(b)
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func validSecretName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Add registers (or replaces) the ownerless secret called name: AddFor
// with owner "".
func (r *Redactor) Add(name, value string) error { return r.AddFor("", name, value) }

// AddFor registers (or replaces) owner's secret called name (owner is
// the secret's team). Every registered value is redacted from every
// text, whoever owns it; the owner only keeps two teams' secrets of one
// name apart, so that a team registering a name another team uses
// cannot take that team's value out of the redaction (threat-model.md
// #20). Names are 1-64 characters of letters, digits, '_', '-' and '.'.
// Values shorter than [MinSecretLen] bytes are refused, as are values
// that could be mistaken for a redaction marker (a value that is part of
// "[REDACTED:<name>]" for some registered name), since redaction could
// not then remove them; the refusal names no other secret.
func (r *Redactor) AddFor(owner, name, value string) error {
	if !validSecretName(name) {
		return fmt.Errorf("egress: secret name %q: want 1-64 characters of letters, digits, '_', '-', '.'", name)
	}
	if len(value) < MinSecretLen {
		return fmt.Errorf("egress: secret %q: value is %d bytes, at least %d are required to redact it reliably", name, len(value), MinSecretLen)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[secretKey]string, len(r.secrets)+1)
	for k, v := range r.secrets {
		next[k] = v
	}
	next[secretKey{owner, name}] = value
	// Every form of every value must be absent from every marker, or a
	// redacted text would still contain it.
	for k := range next {
		m := marker(k.name)
		for _, sv := range next {
			for _, f := range forms(sv) {
				if strings.Contains(m, f) {
					return fmt.Errorf("egress: secret %q: its name or value collides with the redaction marker of a registered secret", name)
				}
			}
		}
	}
	r.secrets = next
	r.rebuild()
	return nil
}

// Remove forgets the ownerless secret called name. Removing an unknown
// name does nothing.
func (r *Redactor) Remove(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := secretKey{"", name}
	if _, ok := r.secrets[key]; !ok {
		return
	}
	next := make(map[secretKey]string, len(r.secrets))
	for k, v := range r.secrets {
		if k != key {
			next[k] = v
		}
	}
	r.secrets = next
	r.rebuild()
}

// rebuild recomputes the pattern list; r.mu is held for writing.
func (r *Redactor) rebuild() {
	var pats []pattern
	for k, v := range r.secrets {
		for _, f := range forms(v) {
			pats = append(pats, pattern{text: f, name: k.name})
		}
	}
	sort.Slice(pats, func(i, j int) bool {
		if len(pats[i].text) != len(pats[j].text) {
			return len(pats[i].text) > len(pats[j].text)
		}
		if pats[i].text != pats[j].text {
			return pats[i].text < pats[j].text
		}
		return pats[i].name < pats[j].name
	})
	r.pats = pats
}

func (r *Redactor) patterns() []pattern {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.pats
}

// Redact returns s with every registered secret value, and its base64 and
// URL-encoded forms, replaced by "[REDACTED:<name>]".
func (r *Redactor) Redact(s string) string {
	pats := r.patterns()
	// Replacing can, for contrived values, join a marker with the text next
	// to it into another secret; run again until nothing matches. Each pass
	// consumes at least one unmasked byte (markers contain no secret form,
	// see Add), so this ends; the bound is a belt and braces.
	for range 16 {
		out, changed := redactOnce(s, pats)
		if !changed {
			return out
		}
		s = out
	}
	if _, changed := redactOnce(s, pats); changed {
		return marker(pats[0].name)
	}
	return s
}

// redactOnce masks every occurrence of every pattern (overlapping ones
// included) and replaces each maximal masked span with one marker, named
// after the longest pattern that starts the span.
func redactOnce(s string, pats []pattern) (string, bool) {
	var owner []int32 // 1 + index of the longest pattern covering a byte
	for i, p := range pats {
		if len(p.text) > len(s) {
			continue
		}
		from := 0
		for {
			j := strings.Index(s[from:], p.text)
			if j < 0 {
				break
			}
			start := from + j
			if owner == nil {
				owner = make([]int32, len(s))
			}
			for k := start; k < start+len(p.text); k++ {
				if owner[k] == 0 {
					owner[k] = int32(i + 1)
				}
			}
			from = start + 1
		}
	}
	if owner == nil {
		return s, false
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if owner[i] == 0 {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteString(marker(pats[owner[i]-1].name))
		for i < len(s) && owner[i] != 0 {
			i++
		}
	}
	return b.String(), true
}

// contains reports whether s holds any registered form.
func containsAny(s string, pats []pattern) bool {
	for _, p := range pats {
		if strings.Contains(s, p.text) {
			return true
		}
	}
	return false
}

// RedactBytes is [Redactor.Redact] for byte slices. It returns b itself
// when there is nothing to redact.
func (r *Redactor) RedactBytes(b []byte) []byte {
	pats := r.patterns()
	if len(pats) == 0 {
		return b
	}
	s := string(b)
	if !containsAny(s, pats) {
		return b
	}
	return []byte(r.Redact(s))
}

// NewSlogHandler wraps next so that secrets never reach it (threat-model.md
// #20): the message, every attribute key and every attribute value are
// redacted with r before next sees them. String values are redacted
// directly; groups are walked recursively; LogValuer values are resolved
// first; errors and fmt.Stringer values are replaced by their redacted
// string form when it contains a secret; any other value (numbers, structs,
// maps, byte slices) is replaced by its redacted text form if that form, or
// its JSON form, contains a secret. corral installs it on every logger, and
// stored audit events are redacted with the same Redactor.
func NewSlogHandler(next slog.Handler, r *Redactor) slog.Handler {
	return &redactHandler{next: next, r: r}
}

type redactHandler struct {
	next slog.Handler
	r    *Redactor
}

func (h *redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	pats := h.r.patterns()
	if len(pats) == 0 {
		return h.next.Handle(ctx, rec)
	}
	nr := slog.NewRecord(rec.Time, rec.Level, h.r.Redact(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(h.attr(a, pats))
		return true
	})
	return h.next.Handle(ctx, nr)
}

func (h *redactHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	pats := h.r.patterns()
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = h.attr(a, pats)
	}
	return &redactHandler{next: h.next.WithAttrs(out), r: h.r}
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{next: h.next.WithGroup(h.r.Redact(name)), r: h.r}
}

// attr returns a with secrets removed from its key and value.
func (h *redactHandler) attr(a slog.Attr, pats []pattern) slog.Attr {
	if len(pats) == 0 {
		return a
	}
	a.Key = h.r.Redact(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(h.r.Redact(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, ga := range g {
			out[i] = h.attr(ga, pats)
		}
		a.Value = slog.GroupValue(out...)
	case slog.KindAny:
		a.Value = h.anyValue(v, pats)
	default:
		// Numbers, durations, times: a numeric secret could still show.
		if s := v.String(); containsAny(s, pats) {
			a.Value = slog.StringValue(h.r.Redact(s))
		} else {
			a.Value = v
		}
	}
	return a
}

func (h *redactHandler) anyValue(v slog.Value, pats []pattern) slog.Value {
	switch t := v.Any().(type) {
	case error:
		// Replace unconditionally: what is printed is what was checked.
		return slog.StringValue(h.r.Redact(t.Error()))
	case fmt.Stringer:
		return slog.StringValue(h.r.Redact(t.String()))
	case []byte:
		if containsAny(string(t), pats) {
			return slog.StringValue(h.r.Redact(string(t)))
		}
		return v
	default:
		s := fmt.Sprintf("%+v", t)
		if containsAny(s, pats) {
			return slog.StringValue(h.r.Redact(s))
		}
		// JSON handlers print the value as JSON, which may differ
		// (byte slices become base64, for one).
		if j, err := json.Marshal(t); err == nil && containsAny(string(j), pats) {
			return slog.StringValue(h.r.Redact(string(j)))
		}
		return v
	}
}
