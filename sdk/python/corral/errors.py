"""Typed errors of the corral SDK.

Every error the server answers carries a stable code (docs/api.md,
"Errors"); :func:`error_for` maps it onto one class here, so that an
agent loop can act on the class instead of parsing text:

- :class:`BrakeError` (:class:`BudgetExhausted`, :class:`LoopDetected`,
  :class:`TaskEnded`): the task's breaker refused the call. The message
  is the server's, which tells the agent to summarise and stop; retrying
  is pointless until an operator resets the task.
- :class:`CapacityExceeded`: too many sandboxes (or streams); wait
  ``retry_after`` seconds and try again.
- :class:`CommandExitError` and :class:`CommandTimeout`: a command ended
  with a non-zero exit code or ran past its timeout; ``result`` holds
  its output.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

__all__ = [
    "CorralError",
    "APIError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "SandboxNotFound",
    "ConflictError",
    "InvalidArgument",
    "CapacityExceeded",
    "TooManyStreams",
    "BrakeError",
    "BudgetExhausted",
    "LoopDetected",
    "TaskEnded",
    "UnavailableError",
    "CommandExitError",
    "CommandTimeout",
    "error_for",
]


class CorralError(Exception):
    """Base class of every error the SDK raises."""


class APIError(CorralError):
    """An error answered by the corral server or a sandbox's agent.

    ``status`` is the HTTP status (0 when unknown), ``code`` the stable
    code (``not_found``, ``budget_exhausted``, ...), ``message`` the
    server's text, and ``retry_after`` the ``Retry-After`` hint in
    seconds (``None`` when the server sent none).
    """

    def __init__(self, message: str, code: str = "", status: int = 0,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        msg = self.message or "request failed"
        if self.code and not msg.startswith(self.code + ":"):
            msg = f"{msg} ({self.code})"
        if self.retry_after is not None:
            msg = f"{msg}; retry after {self.retry_after:g} s"
        return msg


class AuthenticationError(APIError):
    """The API key is missing, wrong or revoked (401 ``unauthenticated``)."""


class ForbiddenError(APIError):
    """The key's role does not allow the call (403 ``forbidden``)."""


class NotFoundError(APIError):
    """The object does not exist, or belongs to another team (404)."""


class SandboxNotFound(NotFoundError):
    """The sandbox is unknown or has ended.

    ``end_reason`` is the sandbox's end reason when it is known (``killed``,
    ``ttl``, ``oom``, ...), else ``""``.
    """

    def __init__(self, message: str, code: str = "not_found", status: int = 404,
                 retry_after: Optional[float] = None, end_reason: str = "") -> None:
        super().__init__(message, code, status, retry_after)
        self.end_reason = end_reason


class ConflictError(APIError):
    """The object is not in a state that allows the call (409), e.g. a
    command in a paused sandbox."""


class InvalidArgument(APIError, ValueError):
    """A value of the request is out of range or malformed (400)."""


class CapacityExceeded(APIError):
    """Too many sandboxes run (globally or for the agent), or the agent
    creates too fast (429 ``capacity_exceeded``). Wait ``retry_after``
    seconds (at least 1) before trying again."""


class TooManyStreams(CapacityExceeded):
    """The API key holds as many streams open as the server allows (429
    ``too_many_streams``)."""


class BrakeError(APIError):
    """A refusal by the task's circuit breaker. The message is the
    server's: it names the budget or the loop and tells the agent to
    stop making tool calls, summarise and finish."""


class BudgetExhausted(BrakeError):
    """A budget of the sandbox's task is spent (403 ``budget_exhausted``)."""


class LoopDetected(BrakeError):
    """The task repeated near-identical calls; its breaker is open (403
    ``loop_detected``)."""


class TaskEnded(BrakeError):
    """The task has ended (403 ``task_ended``)."""


class UnavailableError(APIError):
    """The sandbox's agent or interpreter cannot be reached (502, 503)."""


class CommandExitError(CorralError):
    """A command exited with a non-zero code (raised by ``commands.run``
    unless ``check=False``). ``result`` is its :class:`CommandResult`;
    ``exit_code``, ``stdout`` and ``stderr`` are shortcuts to it."""

    def __init__(self, result: Any, message: str = "") -> None:
        self.result = result
        super().__init__(message or f"command exited with code {result.exit_code}"
                         + (f": {_tail(result.stderr)}" if result.stderr else ""))

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr


class CommandTimeout(CommandExitError):
    """A command ran past its timeout and was killed (exit code 124)."""


def _tail(s: str, n: int = 200) -> str:
    s = s.strip()
    return s if len(s) <= n else "..." + s[-n:]


_BY_CODE = {
    "unauthenticated": AuthenticationError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "already_exists": ConflictError,
    "invalid_argument": InvalidArgument,
    "invalid_json": InvalidArgument,
    "env_secret_refused": InvalidArgument,
    "capacity_exceeded": CapacityExceeded,
    "too_many_streams": TooManyStreams,
    "budget_exhausted": BudgetExhausted,
    "loop_detected": LoopDetected,
    "task_ended": TaskEnded,
    "unavailable": UnavailableError,
    "network_unavailable": UnavailableError,
    "volumes_unavailable": UnavailableError,
    "agent_reply_refused": UnavailableError,
}

_BRAKES = ("budget_exhausted", "loop_detected", "task_ended")

# Codes for an HTTP status when the body names none (the agent's /files
# answers {"code": <int>, ...}).
_BY_STATUS = {
    400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
    404: "not_found", 409: "conflict", 413: "body_too_large",
    429: "capacity_exceeded", 502: "unavailable", 503: "unavailable",
    504: "unavailable", 507: "not_enough_space",
}

# HTTP statuses for Connect codes (errors of the agent API).
_CONNECT_STATUS = {
    "invalid_argument": 400, "out_of_range": 400, "unauthenticated": 401,
    "permission_denied": 403, "not_found": 404, "already_exists": 409,
    "aborted": 409, "failed_precondition": 409, "resource_exhausted": 429,
    "unavailable": 503, "deadline_exceeded": 504, "unimplemented": 501,
    "canceled": 499,
}


def error_for(code: str, message: str, status: int = 0,
              retry_after: Optional[float] = None) -> APIError:
    """Returns the typed error for a server error code.

    A Connect ``resource_exhausted`` whose message starts with a brake's
    code (how the agent API reports a breaker's refusal of a command)
    becomes that brake's error, with status 403.
    """
    if code == "resource_exhausted":
        for brake in _BRAKES:
            if message.startswith(brake + ":"):
                code, status = brake, 403
    if not status:
        status = _CONNECT_STATUS.get(code, 0)
    cls = _BY_CODE.get(code, APIError)
    return cls(message, code, status, retry_after)


def error_from_response(status: int, headers: Mapping[str, str], body: bytes) -> APIError:
    """Builds the typed error of an HTTP error answer.

    It reads the REST shape ``{"code": "<string>", "message": ...}``, the
    agent's ``/files`` shape ``{"code": <int>, "message": ...}``, and any
    other body as the message; ``Retry-After`` (whole seconds) becomes
    ``retry_after``.
    """
    code, message = "", ""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("code" in doc or "message" in doc):
        message = str(doc.get("message") or "")
        c = doc.get("code")
        if isinstance(c, str):
            code = c
        elif isinstance(c, int) and not isinstance(c, bool):
            code = _BY_STATUS.get(c, "")
    else:
        message = body.decode("utf-8", "replace").strip()
    if not code:
        code = _BY_STATUS.get(status, "internal" if status >= 500 else "unknown")
    retry_after = None
    ra = _header(headers, "Retry-After")
    if ra:
        try:
            retry_after = float(int(ra.strip()))
        except ValueError:
            retry_after = None
    return error_for(code, message, status, retry_after)


def _header(headers: Mapping[str, str], name: str) -> str:
    get = getattr(headers, "get", None)
    if get is None:
        return ""
    v = get(name)
    if v is None:
        v = get(name.lower())
    return v or ""
