package agent

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// writeJSONError writes envd's plain-HTTP error body.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Encoding")
	w.Header().Del("Content-Disposition")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// httpError is an error with the HTTP status it maps to.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func httpErrorf(status int, format string, a ...any) *httpError {
	return &httpError{status, fmt.Sprintf(format, a...)}
}

// errTooLarge reports an upload over the configured limit.
var errTooLarge = errors.New("upload too large")

// uploadError maps an error from writing an upload to a status.
func uploadError(err error) *httpError {
	var he *httpError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &he):
		return he
	case errors.As(err, &mbe), errors.Is(err, errTooLarge):
		return httpErrorf(http.StatusRequestEntityTooLarge, "request body too large")
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return httpErrorf(http.StatusInsufficientStorage, "not enough disk space available: %v", err)
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum), errors.Is(err, io.ErrUnexpectedEOF):
		return httpErrorf(http.StatusBadRequest, "invalid request body: %v", err)
	case errors.Is(err, syscall.ENOTDIR):
		return httpErrorf(http.StatusBadRequest, "%v", err)
	case errors.Is(err, fs.ErrPermission):
		return httpErrorf(http.StatusForbidden, "%v", err)
	default:
		return httpErrorf(http.StatusInternalServerError, "%v", err)
	}
}

// httpUser resolves the `username` query parameter, else the default user.
func (s *Server) httpUser(r *http.Request) (*user, *httpError) {
	name := r.URL.Query().Get("username")
	if name == "" {
		name = s.cfg.DefaultUser
	}
	db, err := s.users()
	if err != nil {
		return nil, httpErrorf(http.StatusInternalServerError, "%v", err)
	}
	u, err := db.lookup(name)
	if err != nil {
		return nil, httpErrorf(http.StatusUnauthorized, "error looking up user '%s': %v", name, err)
	}
	return u, nil
}

// handleDownload serves GET /files?path=&username=.
func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	u, he := s.httpUser(r)
	if he != nil {
		writeJSONError(w, he.status, he.msg)
		return
	}
	p, err := resolvePath(r.URL.Query().Get("path"), u)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := os.Open(p)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			writeJSONError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", p))
		case errors.Is(err, fs.ErrPermission):
			writeJSONError(w, http.StatusForbidden, err.Error())
		default:
			writeJSONError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fi.IsDir() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", p))
		return
	}
	name := filepath.Base(p)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": name}))
	w.Header().Add("Vary", "Accept-Encoding")
	gz, ok := acceptsGzip(r.Header.Get("Accept-Encoding"))
	if !ok {
		writeJSONError(w, http.StatusNotAcceptable, "no acceptable content encoding")
		return
	}
	if gz && fi.Size() > 0 && r.Header.Get("Range") == "" && fi.Mode().IsRegular() {
		ct := mime.TypeByExtension(filepath.Ext(name))
		if ct == "" {
			ct = "application/octet-stream"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		zw := gzip.NewWriter(w)
		_, _ = io.Copy(zw, f)
		_ = zw.Close()
		return
	}
	http.ServeContent(w, r, name, fi.ModTime(), f)
}

// acceptsGzip parses Accept-Encoding: gz reports gzip is acceptable; ok
// is false when neither gzip nor identity is.
func acceptsGzip(h string) (gz, ok bool) {
	if strings.TrimSpace(h) == "" {
		return false, true
	}
	identity := true
	identitySet := false
	star := -1.0
	gzq := -1.0
	for _, part := range strings.Split(h, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		coding = strings.ToLower(strings.TrimSpace(coding))
		q := 1.0
		if v, ok := strings.CutPrefix(strings.TrimSpace(params), "q="); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				q = f
			}
		}
		switch coding {
		case "gzip", "x-gzip":
			gzq = q
		case "identity":
			identity, identitySet = q > 0, true
		case "*":
			star = q
		}
	}
	if gzq < 0 && star >= 0 {
		gzq = star
	}
	if !identitySet && star == 0 {
		identity = false
	}
	gz = gzq > 0
	return gz, gz || identity
}

// uploadResult is one element of the POST /files response.
type uploadResult struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// handleUpload serves POST /files: multipart/form-data (field "file", the
// part's full filename as the path unless ?path= is given) or a raw
// application/octet-stream body (optionally gzip-encoded) to ?path=.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	res, he := s.upload(w, r)
	if he != nil {
		writeJSONError(w, he.status, he.msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) ([]uploadResult, *httpError) {
	u, he := s.httpUser(r)
	if he != nil {
		return nil, he
	}
	if r.ContentLength > s.cfg.MaxUpload {
		return nil, httpErrorf(http.StatusRequestEntityTooLarge, "request body too large (limit %d bytes)", s.cfg.MaxUpload)
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUpload)
	md, he := metadataHeaders(r.Header)
	if he != nil {
		return nil, he
	}
	q := r.URL.Query()
	qpath, hasPath := q.Get("path"), q.Has("path")
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return nil, httpErrorf(http.StatusBadRequest, "unsupported content type %q", r.Header.Get("Content-Type"))
	}
	var results []uploadResult
	switch ct {
	case "multipart/form-data":
		if params["boundary"] == "" {
			return nil, httpErrorf(http.StatusBadRequest, "multipart body without boundary")
		}
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				he := uploadError(err)
				if he.status == http.StatusInternalServerError {
					he.status = http.StatusBadRequest
				}
				return nil, he
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := qpath
			if !hasPath {
				target = partFilename(part)
			}
			res, he := s.writeUpload(target, part, u, md)
			part.Close()
			if he != nil {
				return nil, he
			}
			results = append(results, res)
		}
		if len(results) == 0 {
			return nil, httpErrorf(http.StatusBadRequest, "no file part in multipart body")
		}
	case "application/octet-stream":
		if qpath == "" {
			return nil, httpErrorf(http.StatusBadRequest, "path query parameter is required for application/octet-stream uploads")
		}
		var src io.Reader = body
		switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
		case "", "identity":
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(body)
			if err != nil {
				return nil, uploadError(err)
			}
			defer zr.Close()
			src = &limitReader{r: zr, n: s.cfg.MaxUpload}
		default:
			return nil, httpErrorf(http.StatusBadRequest, "unsupported content encoding %q", enc)
		}
		res, he := s.writeUpload(qpath, src, u, md)
		if he != nil {
			return nil, he
		}
		results = append(results, res)
	default:
		return nil, httpErrorf(http.StatusBadRequest, "unsupported content type %q", ct)
	}
	return results, nil
}

// partFilename returns the filename parameter of a part's
// Content-Disposition verbatim: Part.FileName strips directories, but the
// e2b SDK sends the target path there.
func partFilename(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// metadataHeaders collects X-Metadata-<key> headers (key lower-cased);
// keys and values must be printable ASCII.
func metadataHeaders(h http.Header) (map[string]string, *httpError) {
	var md map[string]string
	for k, vs := range h {
		key, ok := strings.CutPrefix(http.CanonicalHeaderKey(k), "X-Metadata-")
		if !ok || len(vs) == 0 {
			continue
		}
		key = strings.ToLower(key)
		if key == "" || !printableASCII(key) || !printableASCII(vs[0]) {
			return nil, httpErrorf(http.StatusBadRequest, "metadata %q must be printable ASCII", key)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
	}
	return md, nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// writeUpload writes src to target (resolved for u): parents created and
// owned by u, file mode 0644 when created, owned by u, metadata replaced.
func (s *Server) writeUpload(target string, src io.Reader, u *user, md map[string]string) (uploadResult, *httpError) {
	if target == "" {
		return uploadResult{}, httpErrorf(http.StatusBadRequest, "missing path")
	}
	p, err := resolvePath(target, u)
	if err != nil {
		return uploadResult{}, httpErrorf(http.StatusBadRequest, "%v", err)
	}
	existed := false
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return uploadResult{}, httpErrorf(http.StatusBadRequest, "path '%s' is a directory", p)
		}
		existed = true
	}
	if err := mkdirAllOwned(filepath.Dir(p), u); err != nil {
		return uploadResult{}, uploadError(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return uploadResult{}, uploadError(err)
	}
	if !existed {
		_ = f.Chmod(0o644)
	}
	if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
		f.Close()
		return uploadResult{}, uploadError(err)
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return uploadResult{}, uploadError(err)
	}
	if err := f.Close(); err != nil {
		return uploadResult{}, uploadError(err)
	}
	if err := writeMetadata(p, md); err != nil {
		return uploadResult{}, httpErrorf(http.StatusInternalServerError, "set metadata: %v", err)
	}
	return uploadResult{Path: p, Name: filepath.Base(p), Type: "file", Metadata: md}, nil
}

// limitReader fails with errTooLarge once more than n bytes were read, so
// a small gzip body cannot expand without bound.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(b []byte) (int, error) {
	if l.n < 0 {
		return 0, errTooLarge
	}
	if int64(len(b)) > l.n+1 {
		b = b[:l.n+1]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	if l.n < 0 {
		return n, errTooLarge
	}
	return n, err
}
