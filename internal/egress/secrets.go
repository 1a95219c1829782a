package egress

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
)

// PlaceholderPrefix starts every secret placeholder; see
// [Secret.Placeholder].
const PlaceholderPrefix = "CORRAL_SECRET_"

// Secret is a credential the operator registered; the sandbox only sees its
// placeholder (threat-model.md #20: secrets never enter the sandbox).
//
// The proxy swaps the placeholder for the value on the way out, and only
// there: for a request to a host matching one of Hosts, in the header named
// Header, every occurrence of [Secret.Placeholder] is replaced with Value.
// Requests to other hosts go out unchanged (the placeholder leaks nothing),
// and the placeholder is never replaced in other headers, in bodies or in
// URLs. Injection happens into HTTPS the proxy intercepts (it needs a
// [CA]; without one, HTTPS to a secret's host is tunnelled as-is and
// nothing is injected). Into plain HTTP (explicit and redirected), where
// the value would cross the network in clear text to anyone on the path,
// it happens only when AllowHTTP is set: otherwise a plain-HTTP request
// that carries the placeholder where it would be replaced is refused with
// [ReasonSecretOverPlainHTTP], naming the secret. TRACE requests, which
// echo the request back, are never injected; an upstream that echoes
// request headers in its responses would still reveal the value, so list
// only hosts trusted with the credential.
//
// Secret's String, GoString, LogValue and MarshalJSON methods never show
// Value, so that printing, logging or encoding one (or a [Client] holding
// one) by mistake does not leak it. In particular a Secret does not
// round-trip through JSON: store secrets with a type of your own.
type Secret struct {
	// Name identifies the secret; see [ValidSecretName].
	Name string
	// Hosts are the hosts the value may be sent to: exact names
	// ("api.openai.com") or "*.suffix" patterns matching strict
	// subdomains, as in [Policy] domains.
	Hosts []string
	// Header is the request header the placeholder is replaced in
	// (case-insensitive), e.g. "Authorization".
	Header string
	// Value is the real credential.
	Value string
	// AllowHTTP lets the proxy inject the value into plain-HTTP requests
	// too. Off by default: the value goes out over TLS only.
	AllowHTTP bool
}

// ReasonSecretOverPlainHTTP is the stable start of the refusal reason of a
// plain-HTTP request carrying the placeholder of a secret that is not
// allowed over plain HTTP ([Secret.AllowHTTP]).
const ReasonSecretOverPlainHTTP = "secret_over_plain_http"

// Placeholder is the text the sandbox sees instead of the value:
// "CORRAL_SECRET_" + Name.
func (s Secret) Placeholder() string { return PlaceholderPrefix + s.Name }

// String describes the secret without its value.
func (s Secret) String() string {
	http := ""
	if s.AllowHTTP {
		http = ", plain HTTP allowed"
	}
	return fmt.Sprintf("secret %s (header %s, hosts %s%s)", s.Name, s.Header, strings.Join(s.Hosts, ","), http)
}

// GoString is String, so that %#v does not print the value either.
func (s Secret) GoString() string { return s.String() }

// LogValue describes the secret for log/slog without its value.
func (s Secret) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("name", s.Name),
		slog.String("header", s.Header),
		slog.String("hosts", strings.Join(s.Hosts, ",")),
		slog.Bool("allow_http", s.AllowHTTP),
	)
}

// MarshalJSON encodes the secret without its value.
func (s Secret) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name      string
		Hosts     []string
		Header    string
		AllowHTTP bool
	}{s.Name, s.Hosts, s.Header, s.AllowHTTP})
}

// ValidSecretName checks a secret name: 1 to 64 characters of ASCII
// letters, digits and '_'. (The placeholder must read as one token in a
// header value, so nothing else is accepted.)
func ValidSecretName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("egress: secret name %q: want 1-64 characters of A-Z, a-z, 0-9 and '_'", name)
	}
	for i := 0; i < len(name); i++ {
		if !isNameByte(name[i]) {
			return fmt.Errorf("egress: secret name %q: character %q is not allowed (want A-Z, a-z, 0-9 and '_')", name, name[i])
		}
	}
	return nil
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// Validate checks the whole secret: its name, at least one valid host
// pattern, a valid header name (not a hop-by-hop or framing header), and a
// non-empty value that can travel in a header (no CR, LF or NUL). Errors
// never contain the value.
func (s Secret) Validate() error {
	if err := ValidSecretName(s.Name); err != nil {
		return err
	}
	if len(s.Hosts) == 0 {
		return fmt.Errorf("egress: secret %s: no hosts", s.Name)
	}
	for _, h := range s.Hosts {
		if _, err := parseDomainPattern(strings.TrimSpace(h)); err != nil {
			return fmt.Errorf("egress: secret %s: host %q: %w", s.Name, h, err)
		}
	}
	if !validHeaderName(s.Header) {
		return fmt.Errorf("egress: secret %s: header %q is not a valid header name", s.Name, s.Header)
	}
	switch http.CanonicalHeaderKey(s.Header) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Proxy-Connection",
		"Keep-Alive", "Te", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Authenticate":
		return fmt.Errorf("egress: secret %s: header %s cannot carry a secret", s.Name, s.Header)
	}
	if s.Value == "" {
		return fmt.Errorf("egress: secret %s: empty value", s.Name)
	}
	if !validValue(s.Value) {
		return fmt.Errorf("egress: secret %s: value contains CR, LF or NUL", s.Name)
	}
	return nil
}

func validValue(v string) bool { return !strings.ContainsAny(v, "\r\n\x00") }

// validHeaderName reports whether h is an RFC 9110 token.
func validHeaderName(h string) bool {
	if h == "" || len(h) > 256 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if isNameByte(c) || strings.IndexByte("!#$%&'*+-.^`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// MatchesHost reports whether the secret may be sent to host: equal to one
// of Hosts, or a strict subdomain of a "*.suffix" pattern. Matching ignores
// case and a trailing dot; IP literals never match.
func (s Secret) MatchesHost(host string) bool {
	h := normalizeHost(host)
	if h == "" || checkName(h) != nil {
		return false
	}
	for _, pat := range s.Hosts {
		p := normalizeHost(pat)
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if suffix != "" && strings.HasSuffix(h, "."+suffix) {
				return true
			}
		} else if p != "" && h == p {
			return true
		}
	}
	return false
}

// hasSecretFor reports whether any secret may be sent to host, i.e.
// whether TLS to host is worth intercepting.
func hasSecretFor(host string, secrets []Secret) bool {
	for _, s := range secrets {
		if s.MatchesHost(host) {
			return true
		}
	}
	return false
}

// injectSecrets replaces placeholders in h for a request to host, per the
// rule on [Secret]: only secrets whose Hosts match host, only in each
// secret's own header. A placeholder is the prefix followed by the longest
// run of name characters, so CORRAL_SECRET_A never matches inside
// CORRAL_SECRET_AB. Secrets with an invalid name or a value that cannot
// travel in a header are skipped.
//
// overTLS says whether the request goes upstream over TLS. When it does
// not, and a placeholder it would replace belongs to a secret without
// [Secret.AllowHTTP], nothing is replaced and the names of those secrets
// come back as refused: the caller must refuse the request (a credential
// sent over plain HTTP is readable by anyone on the path). Otherwise it
// returns the names of the secrets injected. Only names are returned,
// never values.
func injectSecrets(h http.Header, host string, secrets []Secret, overTLS bool) (injected, refused []string) {
	byHeader := map[string]map[string]*Secret{}
	for i := range secrets {
		s := &secrets[i]
		if ValidSecretName(s.Name) != nil || !validValue(s.Value) || s.Value == "" || !validHeaderName(s.Header) || !s.MatchesHost(host) {
			continue
		}
		k := http.CanonicalHeaderKey(s.Header)
		if byHeader[k] == nil {
			byHeader[k] = map[string]*Secret{}
		}
		if _, dup := byHeader[k][s.Name]; !dup {
			byHeader[k][s.Name] = s
		}
	}
	type change struct {
		key string
		i   int
		v   string
	}
	var changes []change
	seen := map[string]bool{}
	for key, byName := range byHeader {
		for i, v := range h[key] {
			out, names := replacePlaceholders(v, byName)
			if len(names) == 0 {
				continue
			}
			changes = append(changes, change{key, i, out})
			for _, n := range names {
				if seen[n] {
					continue
				}
				seen[n] = true
				injected = append(injected, n)
				if !overTLS && !byName[n].AllowHTTP {
					refused = append(refused, n)
				}
			}
		}
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		return nil, refused
	}
	for _, c := range changes {
		h[c.key][c.i] = c.v
	}
	return injected, nil
}

// replacePlaceholders replaces every placeholder of a secret in byName in
// v and returns the result and the names replaced.
func replacePlaceholders(v string, byName map[string]*Secret) (string, []string) {
	if !strings.Contains(v, PlaceholderPrefix) {
		return v, nil
	}
	var b strings.Builder
	var names []string
	rest := v
	for {
		i := strings.Index(rest, PlaceholderPrefix)
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(rest[:i])
		j := i + len(PlaceholderPrefix)
		k := j
		for k < len(rest) && isNameByte(rest[k]) {
			k++
		}
		if s, ok := byName[rest[j:k]]; ok {
			b.WriteString(s.Value)
			names = append(names, s.Name)
		} else {
			b.WriteString(rest[i:k])
		}
		rest = rest[k:]
	}
	if len(names) == 0 {
		return v, nil
	}
	return b.String(), names
}
