package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/corralhq/corral/internal/govern"
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

// writeErr maps an internal error to a status and stable code. Internal
// errors are logged in full but answered without detail, so that host
// paths never reach a caller.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
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
	switch {
	case errors.As(err, &trip):
		writeError(w, http.StatusForbidden, trip.Code, trip.Msg)
	case errors.As(err, &capErr):
		setRetryAfter(w, capErr)
		writeJSON(w, http.StatusTooManyRequests, apiError{Code: CodeCapacityExceeded, Message: capErr.Msg})
	case errors.As(err, &ginv):
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, ginv.Msg)
	case errors.As(err, &inv):
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, inv.Msg)
	case errors.As(err, &vinv):
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, vinv.Msg)
	case errors.As(err, &envSecret):
		writeError(w, http.StatusBadRequest, CodeEnvSecret, envSecret.Error())
	case errors.As(err, &conflict):
		writeError(w, http.StatusConflict, CodeConflict, conflict.Msg)
	case errors.As(err, &rinv):
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, rinv.Msg)
	case errors.As(err, &rconflict):
		writeError(w, http.StatusConflict, CodeConflict, rconflict.Msg)
	case errors.As(err, &vconflict):
		writeError(w, http.StatusConflict, CodeConflict, vconflict.Msg)
	case errors.Is(err, sandbox.ErrNetworkUnavailable):
		writeError(w, http.StatusServiceUnavailable, CodeNetworkUnavailable, err.Error()+"; see the server log")
	case errors.Is(err, volume.ErrUnavailable):
		writeError(w, http.StatusServiceUnavailable, CodeVolumesUnavailable, err.Error())
	case errors.Is(err, volume.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, "volume not found")
	case errors.Is(err, sandbox.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, "sandbox not found")
	case errors.Is(err, store.ErrNotFound):
		// A record that went away during the call (a sandbox that ended
		// while it was being paused, say).
		writeError(w, http.StatusNotFound, CodeNotFound, "not found (it ended or was deleted during the call)")
	case errors.Is(err, sandbox.ErrConflict):
		writeError(w, http.StatusConflict, CodeConflict, "the sandbox's state does not allow this (paused or running already)")
	default:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, CodeInternal, "internal error; see the server log")
	}
}

// decodeJSON reads a bounded JSON body into v, refusing unknown fields
// and trailing data. It writes the error response itself and returns false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, MaxJSONBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	if err == nil {
		return true
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("request body exceeds %d bytes", MaxJSONBody))
		return false
	}
	msg := err.Error()
	if errors.Is(err, io.EOF) {
		msg = "empty body; expected a JSON object"
	}
	writeError(w, http.StatusBadRequest, CodeInvalidJSON, "invalid JSON: "+strings.TrimPrefix(msg, "json: "))
	return false
}
