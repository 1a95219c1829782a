package egress

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
)

func TestRedactorAdd(t *testing.T) {
	var r Redactor
	for _, c := range []struct {
		name, value string
		ok          bool
	}{
		{"github", "ghp_0123456789abcdef", true},
		{"short", "1234567", false},
		{"eight", "12345678", true},
		{"", "long-enough-value", false},
		{"bad name", "long-enough-value", false},
		{"bad]", "long-enough-value", false},
		{"marker", "[REDACTED:", false},
		{"REDACTEDx", "REDACTED", false},
		{"selfname", "selfname", false},
	} {
		err := r.Add(c.name, c.value)
		if (err == nil) != c.ok {
			t.Errorf("Add(%q, %q) error = %v, want ok=%v", c.name, c.value, err, c.ok)
		}
	}
}

func TestRedact(t *testing.T) {
	gh := "ghp_0123456789abcdef"
	aws := "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
	var r Redactor
	for n, v := range map[string]string{
		"github": gh, "aws": aws,
		"outer": "prefix-abcdefgh-inner-secret-suffix", "inner": "inner-secret",
		"left": "AAAABBBBCCCC", "right": "CCCCDDDDEEEE",
		"space": "pass word & more",
	} {
		if err := r.Add(n, v); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ in, want string }{
		{"nothing here", "nothing here"},
		{"", ""},
		{"token=" + gh, "token=[REDACTED:github]"},
		{gh + gh, "[REDACTED:github]"},
		{gh + " and " + gh, "[REDACTED:github] and [REDACTED:github]"},
		{"Authorization: Bearer " + gh + "\n", "Authorization: Bearer [REDACTED:github]\n"},
		{"b64=" + base64.StdEncoding.EncodeToString([]byte(gh)), "b64=[REDACTED:github]"},
		{"raw=" + base64.RawStdEncoding.EncodeToString([]byte(aws)), "raw=[REDACTED:aws]"},
		{"url=" + base64.URLEncoding.EncodeToString([]byte(aws)), "url=[REDACTED:aws]"},
		{"q=" + url.QueryEscape(aws), "q=[REDACTED:aws]"},
		{"q=" + strings.ToLower(url.QueryEscape(aws)), "q=" + strings.ToLower(url.QueryEscape(aws))}, // the whole string lower-cased is another value
		{"q=" + strings.NewReplacer("%2F", "%2f", "%2B", "%2b").Replace(url.QueryEscape(aws)), "q=[REDACTED:aws]"},
		{"p=" + url.PathEscape("pass word & more"), "p=[REDACTED:space]"},
		{"p=" + url.QueryEscape("pass word & more"), "p=[REDACTED:space]"},
		// Longest first: the inner secret inside the outer one.
		{"x prefix-abcdefgh-inner-secret-suffix y", "x [REDACTED:outer] y"},
		{"x inner-secret y", "x [REDACTED:inner] y"},
		// Overlapping secrets: both are covered by one span.
		{"AAAABBBBCCCCDDDDEEEE", "[REDACTED:left]"},
		{"zzCCCCDDDDEEEE", "zz[REDACTED:right]"},
		{"AAAABBBBCCCC", "[REDACTED:left]"},
	}
	for _, tc := range tests {
		if got := r.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := string(r.RedactBytes([]byte(tc.in))); got != tc.want {
			t.Errorf("RedactBytes(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	r.Remove("github")
	r.Remove("unknown")
	if got := r.Redact("t=" + gh); got != "t="+gh {
		t.Errorf("after Remove: %q", got)
	}
}

func TestRedactZero(t *testing.T) {
	var r Redactor
	if got := r.Redact("abc"); got != "abc" {
		t.Fatal(got)
	}
	b := []byte("abc")
	if got := r.RedactBytes(b); &got[0] != &b[0] {
		t.Fatal("RedactBytes copied with nothing to redact")
	}
}

// TestRedactMarkerJoin: a contrived secret that a marker plus neighbouring
// text would rebuild is still removed.
func TestRedactMarkerJoin(t *testing.T) {
	var r Redactor
	if err := r.Add("a", "first-secret"); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("b", "a]tail-part"); err != nil {
		t.Fatal(err)
	}
	out := r.Redact("first-secrettail-part")
	for _, v := range []string{"first-secret", "a]tail-part"} {
		if strings.Contains(out, v) {
			t.Fatalf("%q still contains %q", out, v)
		}
	}
}

type stringer struct{ s string }

func (s stringer) String() string { return s.s }

type config struct {
	User  string
	Token string
	Raw   []byte
}

type valuer struct{ v string }

func (v valuer) LogValue() slog.Value { return slog.StringValue(v.v) }

// TestSlogHandler (threat-model.md #20): a secret passed to a logger in any
// position never reaches the output, for both text and JSON handlers.
func TestSlogHandler(t *testing.T) {
	secret := "sk-live-0123456789abcdef"
	var r Redactor
	if err := r.Add("stripe", secret); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("pin", "4242424242424242"); err != nil {
		t.Fatal(err)
	}
	for _, json := range []bool{false, true} {
		var buf bytes.Buffer
		var next slog.Handler = slog.NewTextHandler(&buf, nil)
		if json {
			next = slog.NewJSONHandler(&buf, nil)
		}
		log := slog.New(NewSlogHandler(next, &r))
		log.Info("calling with "+secret, "token", secret)
		log.With("pre", "k="+secret).WithGroup("g").Info("grouped",
			slog.Group("inner", slog.String("v", secret), slog.Group("deeper", "w", secret)))
		log.Info("err", "err", errors.New("auth failed for "+secret))
		log.Info("wrapped", "err", fmt.Errorf("wrap: %w", errors.New(secret)))
		log.Info("stringer", "s", stringer{"id=" + secret})
		log.Info("struct", "cfg", config{User: "bob", Token: secret})
		log.Info("bytes-in-struct", "cfg", config{Raw: []byte(secret)})
		log.Info("bytes", "b", []byte(secret))
		log.Info("valuer", "v", valuer{secret})
		log.Info("number", "n", int64(4242424242424242))
		log.Info("b64", "h", base64.StdEncoding.EncodeToString([]byte(secret)))
		log.Info("key", secret, 1)
		out := buf.String()
		for _, bad := range []string{secret, base64.StdEncoding.EncodeToString([]byte(secret)), "4242424242424242"} {
			if strings.Contains(out, bad) {
				t.Errorf("json=%v: output contains %q:\n%s", json, bad, out)
			}
		}
		if n := strings.Count(out, "[REDACTED:stripe]"); n < 12 {
			t.Errorf("json=%v: only %d markers:\n%s", json, n, out)
		}
		if !strings.Contains(out, "bob") {
			t.Errorf("json=%v: unrelated data lost:\n%s", json, out)
		}
	}
}

// FuzzRedact: whatever the secrets and the text, the output of Redact never
// contains a registered value.
func FuzzRedact(f *testing.F) {
	f.Add("ghp_0123456789abcdef", "inner-secret", "token ghp_0123456789abcdef and inner-secret")
	f.Add("AAAABBBBCCCC", "CCCCDDDDEEEE", "AAAABBBBCCCCDDDDEEEE")
	f.Add("first-secret", "a]tail-part", "first-secrettail-part")
	f.Add("aaaaaaaa", "aaaaaaaaa", strings.Repeat("a", 50))
	f.Add("pass word&x", "x/y+z=abcd", "pass+word%26x x%2Fy%2Bz%3Dabcd")
	f.Add("\x00\xff\xfe\xfd\xfc\xfb\xfa\xf9", "ééééééé", "\x00\xff\xfe\xfd\xfc\xfb\xfa\xf9ééééééé")
	f.Fuzz(func(t *testing.T, s1, s2, text string) {
		var r Redactor
		var vals []string
		if r.Add("one", s1) == nil {
			vals = append(vals, s1)
		}
		if r.Add("two", s2) == nil {
			vals = append(vals, s2)
		}
		// Embed the secrets in the text too, so the fuzzer need not guess them.
		in := text + s1 + text + s2 + s1
		out := r.Redact(in)
		for _, v := range vals {
			if strings.Contains(out, v) {
				t.Fatalf("Redact(%q) = %q contains %q", in, out, v)
			}
		}
		if got := string(r.RedactBytes([]byte(in))); got != out {
			t.Fatalf("RedactBytes differs: %q vs %q", got, out)
		}
	})
}

// TestRedactorKeepsEachOwnersValue: secret names are per team, so two
// teams may each register a secret called "github". The second must not
// replace the first's value in the redactor: team B registering a name
// team A uses would otherwise take A's value out of the redaction, and
// A's credential would reach the logs and the audit log in clear.
func TestRedactorKeepsEachOwnersValue(t *testing.T) {
	var r Redactor
	a, b := "team-a-secret-value-0123", "team-b-secret-value-4567"
	if err := r.AddFor("team-a", "github", a); err != nil {
		t.Fatal(err)
	}
	if err := r.AddFor("team-b", "github", b); err != nil {
		t.Fatal(err)
	}
	got := r.Redact("a=" + a + " b=" + b)
	if strings.Contains(got, a) || strings.Contains(got, b) {
		t.Fatalf("Redact = %q: a value of one of the two teams' secrets called github is not redacted", got)
	}
	if err := r.AddFor("team-b", "github", "team-b-rotated-value-89"); err != nil {
		t.Fatal(err)
	}
	if got := r.Redact(a); strings.Contains(got, a) {
		t.Fatalf("after team B rotated its secret, team A's value is in clear: %q", got)
	}
}
