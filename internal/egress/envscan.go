package egress

import (
	"regexp"
	"sort"
	"strings"
)

// secretNameRe matches env var names that usually hold credentials.
var secretNameRe = regexp.MustCompile(`(?i)(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|PRIVATE_KEY|ACCESS_KEY|AUTH)($|_)`)

// tokenShapes are value prefixes and shapes of well-known credentials.
var tokenShapes = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`^(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}$`), "a GitHub token"},
	{regexp.MustCompile(`^github_pat_[A-Za-z0-9_]{30,}$`), "a GitHub token"},
	{regexp.MustCompile(`^sk-(proj-|ant-)?[A-Za-z0-9_-]{20,}$`), "an OpenAI/Anthropic-style API key"},
	{regexp.MustCompile(`^(AKIA|ASIA)[0-9A-Z]{16}$`), "an AWS access key id"},
	{regexp.MustCompile(`^xox[abposr]-[A-Za-z0-9-]{10,}$`), "a Slack token"},
	{regexp.MustCompile(`^(sk|rk)_(live|test)_[A-Za-z0-9]{16,}$`), "a Stripe key"},
	{regexp.MustCompile(`^AIza[0-9A-Za-z_-]{35}$`), "a Google API key"},
	{regexp.MustCompile(`^glpat-[A-Za-z0-9_-]{20,}$`), "a GitLab token"},
	{regexp.MustCompile(`^e2b_[0-9a-f]{40}$`), "an E2B or corral API key"},
	{regexp.MustCompile(`^eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}$`), "a JSON web token"},
	{regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----`), "a private key"},
}

// EnvFinding is one env var that looks like a secret. It never carries the
// value.
type EnvFinding struct {
	// Name is the env var's name.
	Name string `json:"name"`
	// Why says what made it suspicious.
	Why string `json:"why"`
}

// ScanEnv returns the env vars that look like secrets passed into a
// sandbox (threat-model.md #20): a value shaped like a well-known credential, a
// long high-entropy value, or a credential-like name (*_KEY, *_TOKEN,
// *_SECRET, *PASSWORD*) with a non-trivial value. Placeholders of brokered
// secrets ("CORRAL_SECRET_...") are not findings. Results are sorted by name.
func ScanEnv(env map[string]string) []EnvFinding {
	var out []EnvFinding
	for k, v := range env {
		if strings.HasPrefix(v, "CORRAL_SECRET_") || strings.HasPrefix(k, "CORRAL_SECRET_") {
			continue
		}
		if why := valueShape(v); why != "" {
			out = append(out, EnvFinding{Name: k, Why: "value looks like " + why})
			continue
		}
		if secretNameRe.MatchString(k) && len(v) >= 8 && !plainWord(v) {
			out = append(out, EnvFinding{Name: k, Why: "name suggests a credential"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func valueShape(v string) string {
	v = strings.TrimSpace(v)
	v = strings.TrimPrefix(v, "Bearer ")
	for _, s := range tokenShapes {
		if s.re.MatchString(v) {
			return s.what
		}
	}
	if len(v) >= 32 && len(v) <= 4096 && !strings.ContainsAny(v, " /\\:") && entropy(v) >= 4.0 {
		return "a random token"
	}
	return ""
}

// plainWord reports values such as "true", "/usr/bin" or "localhost" that
// a credential-like name may hold without being one.
func plainWord(v string) bool {
	switch strings.ToLower(v) {
	case "true", "false", "yes", "no", "none", "null", "disabled", "enabled", "changeme":
		return true
	}
	return strings.HasPrefix(v, "/") || strings.Contains(v, "://")
}
