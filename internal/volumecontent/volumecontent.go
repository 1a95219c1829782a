// Package volumecontent serves E2B's volume content API for volumes whose
// data is a plain directory on the host. The routes and their wire format
// follow E2B's openapi-volumecontent.yml, as used by the e2b SDK's Volume
// class (list, makeDir, getInfo, exists, updateMetadata, readFile,
// writeFile, remove):
//
//	GET    /volumecontent/{volumeID}/dir?path=&depth=                  200 [VolumeEntryStat]
//	POST   /volumecontent/{volumeID}/dir?path=&uid=&gid=&mode=&force=  201 VolumeEntryStat
//	GET    /volumecontent/{volumeID}/path?path=                        200 VolumeEntryStat
//	PATCH  /volumecontent/{volumeID}/path?path=  {uid?, gid?, mode?}   200 VolumeEntryStat
//	DELETE /volumecontent/{volumeID}/path?path=                        204
//	GET    /volumecontent/{volumeID}/file?path=                        200 file bytes
//	PUT    /volumecontent/{volumeID}/file?path=&uid=&gid=&mode=&force= 201 VolumeEntryStat
//
// Errors are JSON objects {"code": "<status>", "message": "..."}: the
// volume content spec types code as a string, unlike the main E2B API.
//
// Sandboxes write into these directories, so everything found in them is
// hostile: a sandbox may plant symbolic links to /etc/shadow or "../..",
// or swap a directory for a link while a request runs. Every file system
// operation therefore goes through an os.Root opened on the volume
// directory, which resolves each path element itself and refuses to leave
// the directory; the handler never joins a request path onto the host
// path. Symbolic links are followed only while they stay inside the
// volume (and never when absolute, since their meaning is the sandbox's,
// not the host's); an operation whose path leads outside fails with 403
// and touches nothing. Entry information is taken with Lstat, so a link is
// reported as a "symlink" with its target rather than followed, and a
// listing does not descend into links. Deleting a link removes the link
// itself; uploads are staged and renamed or linked into place, which never
// follows a final link; ownership and mode of new entries are set through
// their open descriptors. A FIFO planted where a file or directory is
// expected is opened non-blocking, so it cannot hang a request.
//
// Ownership is shifted: the uids and gids the API shows and accepts are
// sandbox ids (0..65535), stored on disk as Options.HostBase+id. Ids on
// disk outside that range are reported as 65534, the kernel's overflow id.
package volumecontent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/idrange"
)

// Errors a Resolver returns to make the handler answer 404 and 401.
var (
	// ErrNotFound means the volume does not exist.
	ErrNotFound = errors.New("volume not found")
	// ErrUnauthorized means the token does not grant access to the volume.
	ErrUnauthorized = errors.New("invalid volume token")
)

// Resolver maps a volume id and the request's bearer token to the volume's
// data directory on the host. It returns ErrNotFound for an unknown volume
// and ErrUnauthorized for a wrong token (the handler answers 404 and 401);
// any other error is answered with 500.
type Resolver func(ctx context.Context, volumeID, token string) (dir string, err error)

// Limits and defaults of the API.
const (
	// DefaultMaxFileBytes is the upload size limit when
	// Options.MaxFileBytes is not set: 1 GiB.
	DefaultMaxFileBytes int64 = 1 << 30
	// MaxDepth caps the depth of a directory listing; deeper requests are
	// answered as if they asked for MaxDepth.
	MaxDepth = 16
	// DefaultUID and DefaultGID own files and directories created without
	// uid or gid: the sandbox user "user" of corral's templates.
	DefaultUID, DefaultGID = idrange.SandboxUser, idrange.SandboxUser
	// MaxID is the largest sandbox uid or gid the API accepts.
	MaxID = idrange.Count - 1
	// OverflowID is reported for an owner on disk that is not a shifted
	// sandbox id, as the kernel does for unmapped ids.
	OverflowID = 65534
	// DefaultFileMode and DefaultDirMode are the permissions of files and
	// directories created without mode.
	DefaultFileMode, DefaultDirMode = 0o644, 0o755

	maxPathLen      = 4096
	maxMetadataBody = 64 << 10
)

// Options tune the handler. The zero value is usable: no id shift, 1 GiB
// uploads, no hooks.
type Options struct {
	// HostBase shifts ownership: uids/gids the API shows and accepts are
	// sandbox uids (0..65535); on disk they are HostBase+uid (corral uses
	// the base of its uid range). Negative values are treated as 0.
	HostBase int
	// MaxFileBytes bounds an upload; a larger PUT gets 413. Zero or
	// negative means DefaultMaxFileBytes.
	MaxFileBytes int64
	// OnWrite, if set, is called after a file upload succeeded, with the
	// volume path written and its size in bytes.
	OnWrite func(volumeID, path string, size int64)
	// OnDelete, if set, is called after a path was removed.
	OnDelete func(volumeID, path string)
}

// New returns the handler of the volume content API. Mount it at
// "/volumecontent/" without stripping the prefix: it expects request
// paths of the form /volumecontent/{volumeID}/{dir,path,file}.
func New(resolve Resolver, opts Options) http.Handler {
	if opts.HostBase < 0 {
		opts.HostBase = 0
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	return &handler{resolve: resolve, opts: opts}
}

type handler struct {
	resolve Resolver
	opts    Options
}

// request is one parsed API call.
type request struct {
	volumeID string
	query    url.Values
	apiPath  string // cleaned, absolute inside the volume: "/", "/a/b"
	rel      string // the same relative to the root: ".", "a/b"
	root     *os.Root
}

const routePrefix = "/volumecontent/"

// allowed lists the methods of each route.
var allowed = map[string][]string{
	"dir":  {http.MethodGet, http.MethodPost},
	"path": {http.MethodGet, http.MethodPatch, http.MethodDelete},
	"file": {http.MethodGet, http.MethodPut},
}

// ServeHTTP routes, authenticates, opens the volume and dispatches.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, routePrefix)
	volumeID, kind, ok2 := strings.Cut(rest, "/")
	methods, known := allowed[kind]
	if !ok || !ok2 || volumeID == "" || !known {
		writeError(w, http.StatusNotFound, "no such route")
		return
	}
	if !methodIn(r.Method, methods) {
		w.Header().Set("Allow", strings.Join(methods, ", "))
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s", r.Method, kind))
		return
	}

	token, ok := bearerToken(r)
	if !ok {
		writeError(w, http.StatusUnauthorized, "missing bearer token")
		return
	}
	dir, err := h.resolve(r.Context(), volumeID, token)
	switch {
	case errors.Is(err, ErrUnauthorized):
		writeError(w, http.StatusUnauthorized, "invalid token for volume "+volumeID)
		return
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "volume "+volumeID+" not found")
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, "could not look up volume "+volumeID)
		return
	}

	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed query string")
		return
	}
	apiPath, rel, err := cleanPath(query.Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		// The error names the host directory: keep it out of the answer.
		writeError(w, http.StatusInternalServerError, "volume "+volumeID+" is not available")
		return
	}
	defer root.Close()
	req := &request{volumeID: volumeID, query: query, apiPath: apiPath, rel: rel, root: root}

	switch kind + " " + r.Method {
	case "dir GET":
		h.listDir(w, r, req)
	case "dir POST":
		h.makeDir(w, req)
	case "path GET":
		h.getInfo(w, req)
	case "path PATCH":
		h.updateMetadata(w, r, req)
	case "path DELETE":
		h.remove(w, req)
	case "file GET":
		h.readFile(w, r, req)
	case "file PUT":
		h.writeFile(w, r, req)
	}
}

func methodIn(m string, ms []string) bool {
	for _, x := range ms {
		if m == x {
			return true
		}
	}
	return false
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header.
func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// cleanPath turns an API path into the volume path it names ("/a/b") and
// the same path relative to the volume root ("a/b", or "." for the root).
// Paths may be absolute inside the volume or relative to its root; "."
// and empty elements are dropped and ".." is resolved lexically, but a
// ".." that would climb above the volume root is refused, as is a NUL.
func cleanPath(p string) (apiPath, rel string, err error) {
	switch {
	case p == "":
		return "", "", errors.New("query parameter path is required")
	case strings.IndexByte(p, 0) >= 0:
		return "", "", errors.New("path contains a NUL byte")
	case len(p) > maxPathLen:
		return "", "", fmt.Errorf("path is longer than %d bytes", maxPathLen)
	}
	var parts []string
	for _, el := range strings.Split(p, "/") {
		switch el {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", "", errors.New("path leads outside the volume")
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, el)
		}
	}
	if len(parts) == 0 {
		return "/", ".", nil
	}
	rel = strings.Join(parts, "/")
	return "/" + rel, rel, nil
}

// ids reads the uid, gid and mode query parameters of a create call.
func ids(q url.Values, defaultMode uint32) (uid, gid int, mode uint32, err error) {
	u, err := queryUint(q, "uid", DefaultUID, MaxID)
	if err != nil {
		return 0, 0, 0, err
	}
	g, err := queryUint(q, "gid", DefaultGID, MaxID)
	if err != nil {
		return 0, 0, 0, err
	}
	m, err := queryUint(q, "mode", uint64(defaultMode), 0o7777)
	if err != nil {
		return 0, 0, 0, err
	}
	return int(u), int(g), uint32(m), nil
}

// queryUint parses a decimal query parameter no larger than limit, or
// returns def when it is absent.
func queryUint(q url.Values, name string, def, limit uint64) (uint64, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > limit {
		return 0, fmt.Errorf("query parameter %s must be an integer between 0 and %d", name, limit)
	}
	return v, nil
}

// queryBool parses a boolean query parameter, false when absent.
func queryBool(q url.Values, name string) (bool, error) {
	s := q.Get(name)
	if s == "" {
		return false, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("query parameter %s must be true or false", name)
	}
	return v, nil
}

// errorBody is the volume content API's Error schema.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Code: strconv.Itoa(status), Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":"500","message":"could not encode the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
