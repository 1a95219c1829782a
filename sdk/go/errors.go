package corral

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Error codes used in [APIError.Code]. The REST API uses the first group;
// errors from the agent API (Connect RPC and /files) are mapped onto the
// same vocabulary where one applies, else they keep their Connect code name
// (for example "already_exists" or "permission_denied").
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidArgument  = "invalid_argument"
	CodeUnauthenticated  = "unauthenticated"
	CodeNotFound         = "not_found"
	CodeConflict         = "conflict"
	CodeBodyTooLarge     = "body_too_large"
	CodeCapacityExceeded = "capacity_exceeded"
	// CodeTooManyStreams: the API key holds as many streams (commands,
	// watches, file transfers, exec calls) open as the server allows.
	CodeTooManyStreams    = "too_many_streams"
	CodeInternal          = "internal"
	CodeUnavailable       = "unavailable"
	CodeAlreadyExists     = "already_exists"
	CodePermissionDenied  = "permission_denied"
	CodeNotEnoughSpace    = "not_enough_space"
	CodeDeadlineExceeded  = "deadline_exceeded"
	CodeUnknown           = "unknown"
	CodeResourceExhausted = "resource_exhausted"
	// CodeBudgetExhausted: a budget of the sandbox's task is spent.
	CodeBudgetExhausted = "budget_exhausted"
	// CodeLoopDetected: the task repeated the same call too often.
	CodeLoopDetected = "loop_detected"
	// CodeTaskEnded: the sandbox's task has ended.
	CodeTaskEnded = "task_ended"
	// CodeAgentReplyRefused: the sandbox's agent answered with a reply over
	// the control plane's bounds (too large, compressed); status 502.
	CodeAgentReplyRefused = "agent_reply_refused"
	// CodeEnvSecretRefused: env vars of the request look like secrets and
	// the server refuses them; status 400.
	CodeEnvSecretRefused = "env_secret_refused"
	// CodeNetworkUnavailable: a network was asked for and the server has
	// none; status 503.
	CodeNetworkUnavailable = "network_unavailable"
	// CodeVolumesUnavailable: volumes were asked for and the server has
	// none; status 503.
	CodeVolumesUnavailable = "volumes_unavailable"
	// CodeNotSupported: the server's runtime driver does not offer the
	// operation (pause, snapshots, processes, volumes or snapshot layers
	// of a sandbox on Kubernetes); status 501.
	CodeNotSupported = "not_supported"
	// CodeForbidden: the key's role does not allow the call (a member key
	// on an admin-only route, or asking for another team's records);
	// status 403. Another team's records are never forbidden but absent
	// (CodeNotFound).
	CodeForbidden = "forbidden"
	// CodeOtherNode: the sandbox runs on another control plane's host
	// (several control planes share one store with the runc or runsc
	// driver); only that node can reach it, and the message names it;
	// status 409.
	CodeOtherNode = "other_node"
)

// APIError is an error reported by the corral server or by a sandbox's
// agent. Status is the HTTP status (0 when unknown), Code a stable
// machine-readable code (see the Code constants) and Message the
// human-readable text.
type APIError struct {
	Status  int
	Code    string
	Message string
	// RetryAfter is the server's Retry-After hint (capacity_exceeded,
	// too_many_streams), or 0.
	RetryAfter time.Duration

	cause error
}

// Error implements error.
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if msg == "" {
		msg = "request failed"
	}
	if e.Code == "" {
		return msg
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%s (%s, retry after %v)", msg, e.Code, e.RetryAfter)
	}
	return fmt.Sprintf("%s (%s)", msg, e.Code)
}

// Unwrap returns the underlying transport error (for example a
// *connect.Error), if any.
func (e *APIError) Unwrap() error { return e.cause }

// Is reports whether target is an *APIError sentinel with the same Code
// (such as [ErrNotFound]), so that errors.Is(err, corral.ErrNotFound) works.
// A target with a non-zero Status must also match the status.
func (e *APIError) Is(target error) bool {
	t, ok := target.(*APIError)
	if !ok || t.Code == "" {
		return false
	}
	return t.Code == e.Code && (t.Status == 0 || t.Status == e.Status)
}

// Sentinel errors for errors.Is; they match any *APIError with the same Code.
var (
	ErrNotFound         = &APIError{Code: CodeNotFound, Message: "not found"}
	ErrInvalidArgument  = &APIError{Code: CodeInvalidArgument, Message: "invalid argument"}
	ErrUnauthenticated  = &APIError{Code: CodeUnauthenticated, Message: "unauthenticated"}
	ErrConflict         = &APIError{Code: CodeConflict, Message: "conflict"}
	ErrCapacityExceeded = &APIError{Code: CodeCapacityExceeded, Message: "capacity exceeded"}
	ErrUnavailable      = &APIError{Code: CodeUnavailable, Message: "unavailable"}
	ErrAlreadyExists    = &APIError{Code: CodeAlreadyExists, Message: "already exists"}
)

// ErrTooLarge is returned by [Files.Read] when the file is larger than the
// read limit.
var ErrTooLarge = errors.New("corral: file larger than the read limit")

// IsNotFound reports whether err is (or wraps) an APIError with code not_found
// (unknown or ended sandbox, missing file or process).
func IsNotFound(err error) bool { return hasCode(err, CodeNotFound) }

// IsInvalidArgument reports whether err is an invalid_argument or
// invalid_json APIError.
func IsInvalidArgument(err error) bool {
	return hasCode(err, CodeInvalidArgument) || hasCode(err, CodeInvalidJSON)
}

// IsUnauthenticated reports whether err is an unauthenticated APIError
// (missing or wrong API key, unknown sandbox user).
func IsUnauthenticated(err error) bool { return hasCode(err, CodeUnauthenticated) }

// IsConflict reports whether err is a conflict APIError.
func IsConflict(err error) bool { return hasCode(err, CodeConflict) }

// IsCapacityExceeded reports whether err is a capacity_exceeded APIError
// (too many sandboxes; see APIError.RetryAfter).
func IsCapacityExceeded(err error) bool { return hasCode(err, CodeCapacityExceeded) }

// IsUnavailable reports whether err is an unavailable APIError (the
// sandbox's agent cannot be reached).
func IsUnavailable(err error) bool { return hasCode(err, CodeUnavailable) }

// IsAlreadyExists reports whether err is an already_exists APIError.
func IsAlreadyExists(err error) bool { return hasCode(err, CodeAlreadyExists) }

func hasCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// codeForStatus maps an HTTP status to an error code.
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalidArgument
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodeBodyTooLarge
	case http.StatusTooManyRequests:
		return CodeCapacityExceeded
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return CodeUnavailable
	case http.StatusInsufficientStorage:
		return CodeNotEnoughSpace
	}
	if status >= 500 {
		return CodeInternal
	}
	return CodeUnknown
}

// statusForConnectCode maps a Connect code to the HTTP status corral would use.
func statusForConnectCode(c connect.Code) int {
	switch c {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted, connect.CodeFailedPrecondition:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeCanceled:
		return 499
	}
	return http.StatusInternalServerError
}

// maxErrorBody bounds how much of an error response body is read.
const maxErrorBody = 64 << 10

// decodeErrorBody builds an APIError from an error response body. It accepts
// the REST shape {"code":"<string>","message":...} and the agent /files
// shape {"code":<int>,"message":...}; anything else becomes the message.
func decodeErrorBody(status int, header http.Header, body []byte) *APIError {
	ae := &APIError{Status: status}
	var wire struct {
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
	}
	if err := json.Unmarshal(body, &wire); err == nil && (len(wire.Code) > 0 || wire.Message != "") {
		ae.Message = wire.Message
		var s string
		var n int
		switch {
		case json.Unmarshal(wire.Code, &s) == nil && s != "":
			ae.Code = s
		case json.Unmarshal(wire.Code, &n) == nil && n != 0:
			if ae.Status == 0 {
				ae.Status = n
			}
			ae.Code = codeForStatus(n)
		}
	} else {
		ae.Message = strings.TrimSpace(string(body))
	}
	if ae.Code == "" {
		ae.Code = codeForStatus(status)
	}
	if ra := header.Get("Retry-After"); ra != "" {
		if secs, err := strconv.Atoi(strings.TrimSpace(ra)); err == nil && secs >= 0 {
			ae.RetryAfter = time.Duration(secs) * time.Second
		}
	}
	return ae
}

// errorFromResponse reads (a bounded part of) resp.Body and decodes it.
func errorFromResponse(resp *http.Response) *APIError {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return decodeErrorBody(resp.StatusCode, resp.Header, body)
}

// fromConnect converts an error from a Connect call into an *APIError. If
// the HTTP layer saw a corral JSON error (for example from the REST proxy in
// front of the agent), that one wins, since Connect maps stream HTTP errors
// from the status alone.
func fromConnect(err error, info *callInfo) error {
	if err == nil {
		return nil
	}
	if info != nil {
		if ae := info.httpError(); ae != nil {
			if ae.cause == nil {
				ae.cause = err
			}
			return ae
		}
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	code := ce.Code()
	if code == connect.CodeCanceled || code == connect.CodeDeadlineExceeded {
		// Context errors are more useful as themselves.
		if cause := errors.Unwrap(ce); cause != nil && (errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded)) {
			return cause
		}
	}
	ae := &APIError{
		Status:  statusForConnectCode(code),
		Code:    code.String(),
		Message: ce.Message(),
		cause:   err,
	}
	// A brake refusing a command arrives as resource_exhausted with the
	// brake's code in front of the message.
	if code == connect.CodeResourceExhausted {
		for _, c := range []string{CodeBudgetExhausted, CodeLoopDetected, CodeTaskEnded} {
			if strings.HasPrefix(ae.Message, c+":") {
				ae.Code, ae.Status = c, http.StatusForbidden
			}
		}
	}
	return ae
}

// IsBrake reports whether err is a refusal by a task's breaker
// (budget_exhausted, loop_detected or task_ended): the agent should stop
// and summarise instead of retrying.
func IsBrake(err error) bool {
	return hasCode(err, CodeBudgetExhausted) || hasCode(err, CodeLoopDetected) || hasCode(err, CodeTaskEnded)
}
