"""Result and record types of the corral SDK."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._http import b64decode


class Record(dict):
    """A server object (sandbox, snapshot, template, ...) as the JSON
    the API answered, with attribute access to its fields:
    ``rec.state == rec["state"]``. A missing field reads as None."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        v = self.get(name)
        if isinstance(v, dict) and not isinstance(v, Record):
            v = Record(v)
        return v

    def __dir__(self):  # pragma: no cover - for interactive use
        return list(self.keys()) + list(super().__dir__())


def parse_time(s: Optional[str]) -> Optional[_dt.datetime]:
    """Parses an RFC 3339 time (nanoseconds are cut to microseconds)."""
    if not s:
        return None
    s = s.strip()
    if s.endswith("Z") or s.endswith("z"):
        s = s[:-1] + "+00:00"
    s = re.sub(r"(\.\d{6})\d+", r"\1", s)
    try:
        return _dt.datetime.fromisoformat(s)
    except ValueError:
        return None


@dataclass
class CommandResult:
    """The outcome of a command.

    ``stdout`` and ``stderr`` keep the last ``max_output`` bytes of each
    stream (decoded as UTF-8, bad bytes replaced); ``stdout_bytes`` and
    ``stderr_bytes`` count everything; ``truncated`` says bytes were
    dropped. ``exit_code`` is 124 when the timeout elapsed (``timed_out``)
    and 128+n when a signal n killed the command (137 for SIGKILL);
    ``end_reason`` is ``timeout``, ``oom`` or ``killed`` when the command
    did not exit on its own. ``duration_ms`` is measured by the SDK from
    the start event to the end event."""

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    truncated: bool = False
    timed_out: bool = False
    end_reason: str = ""
    status: str = ""
    pid: int = 0
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0


FILE_TYPES = {"FILE_TYPE_FILE": "file", "FILE_TYPE_DIRECTORY": "dir", "FILE_TYPE_SYMLINK": "symlink",
              1: "file", 2: "dir", 3: "symlink"}


@dataclass
class EntryInfo:
    """A file or directory in a sandbox. ``type`` is ``file``, ``dir``,
    ``symlink`` or ``""``; for a symlink, ``symlink_target`` is its
    resolved target."""

    name: str
    type: str
    path: str
    size: int = 0
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_time: Optional[_dt.datetime] = None
    symlink_target: str = ""

    @classmethod
    def from_wire(cls, e: Dict[str, Any]) -> "EntryInfo":
        """Decodes a filesystem.EntryInfo in protobuf JSON (int64 as
        strings, enums by name)."""
        return cls(
            name=e.get("name", ""),
            type=FILE_TYPES.get(e.get("type", ""), ""),
            path=e.get("path", ""),
            size=int(e.get("size") or 0),
            mode=int(e.get("mode") or 0),
            permissions=e.get("permissions", ""),
            owner=e.get("owner", ""),
            group=e.get("group", ""),
            modified_time=parse_time(e.get("modifiedTime") or e.get("modified_time")),
            symlink_target=e.get("symlinkTarget") or e.get("symlink_target") or "",
        )


# The formats a code result may carry (E2B's result fields).
RESULT_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex",
                  "json", "javascript", "data", "chart")
_BINARY_FORMATS = ("png", "jpeg", "pdf")


@dataclass
class Result:
    """One result of a code run (the value of the last expression, or a
    displayed object). Image formats (``png``, ``jpeg``, ``pdf``) are bytes;
    the others are as the interpreter sent them (text as str, ``json`` and
    ``data`` as decoded JSON). ``raw`` is the line as it came."""

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[bytes] = None
    jpeg: Optional[bytes] = None
    pdf: Optional[bytes] = None
    latex: Optional[str] = None
    json: Any = None
    javascript: Optional[str] = None
    data: Any = None
    chart: Any = None
    is_main_result: bool = False
    extra: Any = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "Result":
        r = cls(is_main_result=bool(d.get("is_main_result")), extra=d.get("extra"), raw=d)
        for f in RESULT_FORMATS:
            v = d.get(f)
            if v is None:
                continue
            if f in _BINARY_FORMATS and isinstance(v, str):
                v = b64decode(v)
            setattr(r, f, v)
        return r

    def formats(self) -> List[str]:
        """The formats this result has, e.g. ``["text", "png"]``."""
        return [f for f in RESULT_FORMATS if getattr(self, f) is not None]


@dataclass
class ExecutionError:
    """The error a code run raised: its class ``name`` (``ZeroDivisionError``;
    ``TimeoutError`` when the run's timeout elapsed, ``OutOfMemoryError``
    when the sandbox's memory limit killed it), ``value`` and
    ``traceback``."""

    name: str
    value: str
    traceback: str = ""


@dataclass
class Logs:
    """What a code run printed, as the chunks that came."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """The outcome of ``Sandbox.run_code``."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    truncated: bool = False
    timed_out: bool = False
    oom: bool = False
    duration_ms: int = 0

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the last expression's value), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "Execution":
        """Decodes the native answer of ``POST /v1/sandboxes/{id}/code``."""
        logs = d.get("logs") or {}
        err = d.get("error")
        return cls(
            results=[Result.from_wire(r) for r in d.get("results") or []],
            logs=Logs(stdout=list(logs.get("stdout") or []), stderr=list(logs.get("stderr") or [])),
            error=ExecutionError(err.get("name", ""), err.get("value", ""), err.get("traceback", "")) if err else None,
            execution_count=d.get("execution_count"),
            truncated=bool(d.get("truncated")),
            timed_out=bool(d.get("timed_out")),
            oom=bool(d.get("oom")),
            duration_ms=int(d.get("duration_ms") or 0),
        )


@dataclass
class CodeContext:
    """An interpreter context: its own variables and working directory."""

    id: str
    language: str = ""
    cwd: str = ""
