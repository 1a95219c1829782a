// Package console serves corral's operator console: a static page (HTML,
// CSS, JavaScript, embedded in the binary, no outside resource) under
// /ui/ that signs in with an API key and reads everything through the
// public REST API with that key, so it shows exactly what the key's team
// may see (docs/console.md).
package console

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// CSP is the console's Content-Security-Policy. Only the page's own
// files load and only its own origin is reached: no inline script or
// style (so markup injected into the page could not run), no plugin,
// no <base> rewrite, no form posted anywhere, and no page may frame it.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files under Prefix. Every answer carries
// the security headers (setHeaders); an unknown path is 404, and
// nothing else (no directory listing) is served.
func Handler() http.Handler {
	root, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setHeaders(w.Header())
		name := strings.TrimPrefix(r.URL.Path, Prefix)
		if name == "" {
			name = "index.html"
		}
		if !fs.ValidPath(name) {
			http.NotFound(w, r)
			return
		}
		data, err := fs.ReadFile(root, name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		ct := mime.TypeByExtension(path.Ext(name))
		if ct == "" {
			ct = "application/octet-stream"
		}
		w.Header().Set("Content-Type", ct)
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(data)
	})
}

// setHeaders sets the headers of every console answer. They defend
// against script injection (CSP), clickjacking (frame-ancestors and
// X-Frame-Options), content-type sniffing, the page's address leaking
// to another site (Referrer-Policy), another window keeping a handle on
// the console (COOP) and stale or shared copies (no-cache: each load
// revalidates; the API's answers are no-store).
func setHeaders(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
}
