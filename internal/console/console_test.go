package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestHeaders defends against script injection, framing (clickjacking)
// and sniffing of the console: every answer, a file or a 404, carries the
// strict CSP (no inline script, own origin only, no framing),
// X-Frame-Options DENY and nosniff; files have their own content type;
// an unknown or escaping path is 404 and a directory is never listed.
func TestHeaders(t *testing.T) {
	t.Parallel()
	h := Handler()
	cases := []struct {
		path, status, ctype string
	}{
		{"/ui/", "200", "text/html; charset=utf-8"},
		{"/ui/index.html", "200", "text/html; charset=utf-8"},
		{"/ui/app.js", "200", "text/javascript; charset=utf-8"},
		{"/ui/app.css", "200", "text/css; charset=utf-8"},
		{"/ui/nope.js", "404", ""},
		{"/ui/../console.go", "404", ""},
		{"/ui/static/", "404", ""},
		{"/ui/./app.js", "404", ""},
	}
	for _, c := range cases {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.URL.Path = c.path // unclean on purpose
		h.ServeHTTP(rec, req)
		if got := http.StatusText(rec.Code); rec.Code != atoi(c.status) {
			t.Errorf("%s: %d %s", c.path, rec.Code, got)
		}
		hd := rec.Header()
		if hd.Get("Content-Security-Policy") != CSP || hd.Get("X-Frame-Options") != "DENY" || hd.Get("X-Content-Type-Options") != "nosniff" || hd.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: security headers %v", c.path, hd)
		}
		if c.ctype != "" && hd.Get("Content-Type") != c.ctype {
			t.Errorf("%s: Content-Type %q, want %q", c.path, hd.Get("Content-Type"), c.ctype)
		}
	}
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'"} {
		if !strings.Contains(CSP, want) {
			t.Errorf("CSP lacks %q: %s", want, CSP)
		}
	}
	if strings.Contains(CSP, "unsafe-") {
		t.Errorf("CSP allows unsafe sources: %s", CSP)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// TestAssetsSafe defends against the console turning attacker-controlled
// data (sandbox metadata, commands, file names, audit data) into markup
// or code, against the key leaving session storage, and against the page
// loading anything from elsewhere: the shipped files use no HTML sink
// (innerHTML, outerHTML, insertAdjacentHTML, document.write), no eval or
// string timers, no localStorage or cookie, no inline script or style
// and no address off the page's own origin. The browser test
// (TestConsole in test/integration) checks an XSS payload renders as text.
func TestAssetsSafe(t *testing.T) {
	t.Parallel()
	banned := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setTimeout\(['"]|setInterval\(['"]|localStorage|document\.cookie|\.style\s*=|setAttribute\(['"]style`)
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(static, p)
		if err != nil {
			return err
		}
		src := string(b)
		for i, line := range strings.Split(src, "\n") {
			if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "//") {
				continue // comments name the sinks they avoid
			}
			if m := banned.FindString(line); m != "" {
				t.Errorf("%s:%d uses %q: %s", p, i+1, m, strings.TrimSpace(line))
			}
			for _, m := range external.FindAllString(line, -1) {
				if m != "http://www.w3.org" && m != "//www.w3.org" {
					t.Errorf("%s:%d names an outside address %q", p, i+1, m)
				}
			}
		}
		if strings.HasSuffix(p, ".html") {
			tags := regexp.MustCompile(`<script([^>]*)>([^<]*)</script>`).FindAllStringSubmatch(src, -1)
			if len(tags) != strings.Count(src, "<script") {
				t.Errorf("%s has a script tag that is not <script src=...></script>", p)
			}
			for _, m := range tags {
				if !strings.Contains(m[1], "src=") || strings.TrimSpace(m[2]) != "" {
					t.Errorf("%s has an inline script: %s", p, m[0])
				}
			}
			if regexp.MustCompile(`<style|\sstyle=|\son[a-z]+=`).MatchString(src) {
				t.Errorf("%s has inline style or an inline event handler", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
