package api

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/proto/filesystem"
)

// maxAuditedBody bounds the unary request bodies read to learn the paths
// of filesystem calls (they are a few hundred bytes).
const maxAuditedBody = 64 << 10

// fileAudit wraps the agent proxy: successful file writes (POST /files),
// deletes, moves and directory creations through the agent API are
// recorded in the audit log with their paths and sizes.
func fileAudit(mgr *sandbox.Manager, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind, data := fileOp(r)
		if kind == "" {
			next.ServeHTTP(w, r)
			return
		}
		var counted *countingReader
		if kind == "file.write" && r.Body != nil {
			counted = &countingReader{r: r.Body}
			r.Body = struct {
				io.Reader
				io.Closer
			}{counted, r.Body}
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if sw.status/100 != 2 {
			return
		}
		if counted != nil {
			data["bytes"] = counted.n
		}
		mgr.RecordEvent(r.Context(), sandboxIDFrom(r.Context()), kind, data)
	})
}

// fileOp names the file operation of an agent request and its paths, or
// returns "" for requests that change no file.
func fileOp(r *http.Request) (string, map[string]any) {
	if r.URL.Path == "/files" && r.Method == http.MethodPost {
		d := map[string]any{"path": r.URL.Query().Get("path")}
		if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
			d["multipart"] = true
		}
		return "file.write", d
	}
	var msg proto.Message
	var kind string
	switch r.URL.Path {
	case "/filesystem.Filesystem/Remove":
		msg, kind = &filesystem.RemoveRequest{}, "file.delete"
	case "/filesystem.Filesystem/Move":
		msg, kind = &filesystem.MoveRequest{}, "file.move"
	case "/filesystem.Filesystem/MakeDir":
		msg, kind = &filesystem.MakeDirRequest{}, "file.mkdir"
	default:
		return "", nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAuditedBody+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil || len(body) > maxAuditedBody {
		return kind, map[string]any{"path": "(unreadable request)"}
	}
	ct := r.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/json"):
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(body, msg)
	case strings.HasPrefix(ct, "application/proto"):
		err = proto.Unmarshal(body, msg)
	}
	d := map[string]any{}
	switch m := msg.(type) {
	case *filesystem.RemoveRequest:
		d["path"] = m.GetPath()
	case *filesystem.MakeDirRequest:
		d["path"] = m.GetPath()
	case *filesystem.MoveRequest:
		d["source"], d["destination"] = m.GetSource(), m.GetDestination()
	}
	if err != nil {
		d["decode_error"] = true
	}
	return kind, d
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// statusWriter remembers the response status; it keeps flushing and full
// duplex working through http.ResponseController (Unwrap).
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
