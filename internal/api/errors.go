package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/internal/volume"
	corral "github.com/corralhq/corral/sdk/go"
)

// Stable error codes of the native API (docs/api.md). The Go SDK's
// constants are their one definition: the SDK is the contract clients
// compile against, so a code the server answers with is a code the SDK
// names.
const (
	CodeInvalidJSON        = corral.CodeInvalidJSON
	CodeInvalidArgument    = corral.CodeInvalidArgument
	CodeUnauthenticated    = corral.CodeUnauthenticated
	CodeNotFound           = corral.CodeNotFound
	CodeConflict           = corral.CodeConflict
	CodeBodyTooLarge       = corral.CodeBodyTooLarge
	CodeCapacityExceeded   = corral.CodeCapacityExceeded
	CodeTooManyStreams     = corral.CodeTooManyStreams
	CodeInternal           = corral.CodeInternal
	CodeUnavailable        = corral.CodeUnavailable
	CodeAgentReply         = corral.CodeAgentReplyRefused
	CodeEnvSecret          = corral.CodeEnvSecretRefused
	CodeNetworkUnavailable = corral.CodeNetworkUnavailable
	CodeVolumesUnavailable = corral.CodeVolumesUnavailable
	CodeNotSupported       = corral.CodeNotSupported
	CodeForbidden          = corral.CodeForbidden
	CodeOtherNode          = corral.CodeOtherNode
)

// MaxJSONBody bounds JSON request bodies.
const MaxJSONBody = 1 << 20

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "5")
	}
	writeJSON(w, status, apiError{Code: code, Message: msg})
}

// setRetryAfter sets the Retry-After header of a capacity refusal, in
// whole seconds (at least 1). Native and E2B answers both use it, so that
// a refused create carries the same hint on either API.
func setRetryAfter(w http.ResponseWriter, capErr *govern.CapacityError) {
	w.Header().Set("Retry-After", retryAfter(capErr.RetryAfter.Seconds()))
}

// apiFailure is an internal error mapped to what the API answers.
type apiFailure struct {
	status        int
	code, msg     string
	capacity      *govern.CapacityError // set for capacity refusals (Retry-After)
	internalError bool                  // unexpected: log it, answer without detail
}

// classify maps an internal error to a status, a stable code and a
// message, for the native and the E2B answers alike (one mapping, two
// shapes). Internal errors get no detail, so that host paths never reach
// a caller.
func classify(err error) apiFailure {
	var inv *sandbox.InvalidError
	var conflict *sandbox.ConflictError
	var vinv *volume.InvalidError
	var vconflict *volume.ConflictError
	var envSecret *sandbox.EnvSecretError
	var trip *govern.TripError
	var capErr *govern.CapacityError
	var ginv *govern.InvalidError
	var rinv *registry.InvalidError
	var rconflict *registry.ConflictError
	var kinv *store.InvalidKeyError
	var other *sandbox.OtherNodeError
	var param *ParamError
	var body *bodyError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &body), errors.As(err, &mbe):
		return bodyFailure(err)
	case errors.As(err, &param):
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: param.Error()}
	case errors.Is(err, errForbiddenTeam), errors.Is(err, errAdminOnly):
		return apiFailure{status: http.StatusForbidden, code: CodeForbidden, msg: err.Error()}
	case errors.As(err, &trip):
		return apiFailure{status: http.StatusForbidden, code: trip.Code, msg: trip.Msg}
	case errors.As(err, &capErr):
		return apiFailure{status: http.StatusTooManyRequests, code: CodeCapacityExceeded, msg: capErr.Msg, capacity: capErr}
	case errors.As(err, &ginv):
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: ginv.Msg}
	case errors.As(err, &inv):
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: inv.Msg}
	case errors.As(err, &vinv):
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: vinv.Msg}
	case errors.As(err, &envSecret):
		return apiFailure{status: http.StatusBadRequest, code: CodeEnvSecret, msg: envSecret.Error()}
	case errors.As(err, &conflict):
		return apiFailure{status: http.StatusConflict, code: CodeConflict, msg: conflict.Msg}
	case errors.As(err, &other):
		return apiFailure{status: http.StatusConflict, code: CodeOtherNode, msg: other.Error()}
	case errors.As(err, &kinv):
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: kinv.Msg}
	case errors.As(err, &rinv):
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidArgument, msg: rinv.Msg}
	case errors.As(err, &rconflict):
		return apiFailure{status: http.StatusConflict, code: CodeConflict, msg: rconflict.Msg}
	case errors.As(err, &vconflict):
		return apiFailure{status: http.StatusConflict, code: CodeConflict, msg: vconflict.Msg}
	case errors.Is(err, sandbox.ErrShuttingDown):
		return apiFailure{status: http.StatusServiceUnavailable, code: CodeUnavailable, msg: err.Error()}
	case errors.Is(err, sandbox.ErrNetworkUnavailable):
		return apiFailure{status: http.StatusServiceUnavailable, code: CodeNetworkUnavailable, msg: err.Error() + "; see the server log"}
	case errors.Is(err, volume.ErrUnavailable):
		return apiFailure{status: http.StatusServiceUnavailable, code: CodeVolumesUnavailable, msg: err.Error()}
	case errors.Is(err, volume.ErrNotFound):
		return apiFailure{status: http.StatusNotFound, code: CodeNotFound, msg: "volume not found"}
	case errors.Is(err, sandbox.ErrNotFound):
		return apiFailure{status: http.StatusNotFound, code: CodeNotFound, msg: "sandbox not found"}
	case errors.Is(err, runtime.ErrUnsupported):
		return apiFailure{status: http.StatusNotImplemented, code: CodeNotSupported,
			msg: "the server's runtime driver does not support this (a sandbox on Kubernetes cannot be paused, snapshotted, listed by process or given volumes)"}
	case errors.Is(err, store.ErrNotFound):
		// A record that went away during the call (a sandbox that ended
		// while it was being paused, say).
		return apiFailure{status: http.StatusNotFound, code: CodeNotFound, msg: "not found (it ended or was deleted during the call)"}
	case errors.Is(err, sandbox.ErrConflict):
		return apiFailure{status: http.StatusConflict, code: CodeConflict, msg: "the sandbox's state does not allow this (paused or running already)"}
	case errors.Is(err, runtime.ErrKeyQuota):
		c := &govern.CapacityError{Limit: govern.CapacityGlobal, RetryAfter: keyQuotaRetry, Msg: keyQuotaMsg}
		return apiFailure{status: http.StatusTooManyRequests, code: CodeCapacityExceeded, msg: c.Msg, capacity: c}
	}
	return apiFailure{status: http.StatusInternalServerError, code: CodeInternal, msg: "internal error; see the server log", internalError: true}
}

// keyQuotaMsg is the refusal of a create that runc failed for the
// kernel's per-user key quota.
const keyQuotaMsg = "the kernel's per-user key quota is full (kernel.keys.maxkeys, kernel.keys.maxbytes: lowered since the server started, " +
	"or filled by other processes of the sandboxes' host uid): runc could not give the sandbox its session keyring; " +
	"retry when sandboxes have ended, or raise the quota on the host (sysctl -w kernel.keys.maxkeys=N kernel.keys.maxbytes=M)"

// keyQuotaRetry is the Retry-After of that refusal.
const keyQuotaRetry = 5 * time.Second

// writeErr answers err in the native shape ({"code", "message"}).
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	f := classify(err)
	if f.internalError {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	s.writeFailure(w, r, f)
}

// writeFailure answers a classified failure in the native shape.
func (s *Server) writeFailure(w http.ResponseWriter, r *http.Request, f apiFailure) {
	if f.capacity != nil {
		setRetryAfter(w, f.capacity)
		writeJSON(w, f.status, apiError{Code: f.code, Message: f.msg})
		return
	}
	writeError(w, f.status, f.code, f.msg)
}

// decodeJSON reads a bounded JSON body into v by the rule of parseJSON,
// strict: unknown fields, keys given twice and trailing data are
// refused. It writes the error response itself and returns false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err == nil {
		err = parseJSON(data, v, true)
	}
	if err == nil {
		return true
	}
	f := bodyFailure(err)
	writeError(w, f.status, f.code, f.msg)
	return false
}

// bodyFailure classifies the error of reading a request body through
// http.MaxBytesReader and parsing it (parseJSON), for every API shape
// (native, E2B's, MCP's JSON-RPC): over the bound is 413
// body_too_large, anything else 400 invalid_json with parseJSON's
// message.
func bodyFailure(err error) apiFailure {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return apiFailure{status: http.StatusRequestEntityTooLarge, code: CodeBodyTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
	}
	var be *bodyError
	if errors.As(err, &be) {
		return apiFailure{status: http.StatusBadRequest, code: CodeInvalidJSON, msg: be.msg}
	}
	// a read that failed otherwise: the client went away, say
	return apiFailure{status: http.StatusBadRequest, code: CodeInvalidJSON, msg: "reading the body: " + err.Error()}
}
