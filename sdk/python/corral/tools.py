"""Ready-made tools for function calling: ``execute_code`` and its
schema.

    import corral.tools
    tools = [corral.tools.openai_tool()]          # or anthropic_tool()
    ...
    result = corral.tools.call_tool(name, arguments)   # the model's call

``execute_code`` creates a sandbox (or uses the one given), runs the code,
and returns a bounded, JSON-serialisable answer for the model; it always
kills the sandbox it created. Brake errors (:class:`BudgetExhausted`,
:class:`LoopDetected`, :class:`TaskEnded`) and :class:`CapacityExceeded`
are raised, not returned, so that the agent loop can stop or wait.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Dict, Mapping, Optional, Union

from .errors import SandboxNotFound, CorralError

__all__ = ["EXECUTE_CODE_SCHEMA", "EXECUTE_CODE_TOOL", "LANGUAGES", "MAX_TIMEOUT",
           "execute_code", "openai_tool", "anthropic_tool", "call_tool"]

# Interpreter and file suffix of each language (programs of the base
# template). python3 -u: unbuffered, so that what the program printed
# before a timeout killed it is not lost in its buffer.
LANGUAGES = {"python": ("python3 -u", ".py"), "bash": ("bash", ".sh")}

MAX_TIMEOUT = 600
"""The longest timeout, in seconds, the schema lets a model ask for."""

EXECUTE_CODE_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "The complete program to run. Print what you want to see: "
                           "only stdout and stderr come back, and only their last part.",
        },
        "language": {
            "type": "string",
            "enum": sorted(LANGUAGES),
            "default": "python",
            "description": "python (python3) or bash.",
        },
        "timeout": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_TIMEOUT,
            "default": 30,
            "description": "Seconds before the program is killed.",
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}
"""The JSON schema of execute_code's arguments (function calling)."""

EXECUTE_CODE_TOOL: Dict[str, Any] = {
    "name": "execute_code",
    "description": "Run a program in a fresh, isolated Linux sandbox (no network) and get "
                   "its combined stdout and stderr (the tail, bounded), exit code, whether "
                   "it timed out, and how long it ran. Nothing persists between calls.",
    "parameters": EXECUTE_CODE_SCHEMA,
}
"""The tool definition: name, description and parameters schema."""


def openai_tool() -> Dict[str, Any]:
    """execute_code as an OpenAI ``tools`` entry."""
    return {"type": "function", "function": dict(EXECUTE_CODE_TOOL)}


def anthropic_tool() -> Dict[str, Any]:
    """execute_code as an Anthropic ``tools`` entry."""
    return {"name": EXECUTE_CODE_TOOL["name"], "description": EXECUTE_CODE_TOOL["description"],
            "input_schema": EXECUTE_CODE_SCHEMA}


class _TextTail:
    """The last ``max`` characters of the text written to it."""

    def __init__(self, max_chars: int) -> None:
        self.max = max(0, int(max_chars))
        self.parts: list = []
        self.kept = 0
        self.total = 0

    def write(self, s: str) -> None:
        self.total += len(s)
        self.parts.append(s)
        self.kept += len(s)
        while self.parts and self.kept - len(self.parts[0]) >= self.max:
            self.kept -= len(self.parts.pop(0))

    def text(self) -> str:
        s = "".join(self.parts)
        return s[len(s) - self.max:] if len(s) > self.max else s

    @property
    def truncated(self) -> bool:
        return self.total > self.max


def execute_code(code: str, timeout: float = 30, max_output: int = 2000, sandbox: Any = None,
                 language: str = "python", *, client: Any = None, template: Optional[str] = None,
                 task: Any = None) -> Dict[str, Any]:
    """Runs ``code`` and returns ``{"output", "truncated", "exit_code",
    "timed_out", "duration_ms"}``.

    ``output`` is the last ``max_output`` characters of stdout and stderr
    together (one pipe), in the order the program wrote them;
    ``truncated`` says earlier output was dropped. The program is killed after ``timeout`` seconds
    (``timed_out``, exit code 124). ``language`` is ``python`` (python3)
    or ``bash``. Without ``sandbox`` a new one is created (``template``,
    default ``base``, in ``task`` when given, with ``client``) and killed
    when the call ends, whatever happens; a given sandbox is left
    running (the program's file is removed from it).
    """
    if language not in LANGUAGES:
        raise ValueError(f"language {language!r}: want one of {', '.join(sorted(LANGUAGES))}")
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    if not timeout or timeout <= 0:
        raise ValueError("timeout must be more than 0 seconds")
    from .sandbox import Sandbox
    prog, ext = LANGUAGES[language]
    created = None
    sb = sandbox
    path = f"/tmp/corral-exec-{secrets.token_hex(8)}{ext}"
    try:
        if sb is None:
            created = sb = Sandbox(template=template, timeout=int(timeout) + 60, task=task, client=client,
                                   metadata={"corral_tool": "execute_code"})
        sb.files.write(path, code)
        tail = _TextTail(max_output)
        # One pipe for both streams (2>&1): the output is in the order
        # the program wrote it, which two pipes cannot promise.
        res = sb.commands.run(f"{prog} {path} 2>&1", timeout=timeout, check=False,
                              on_stdout=tail.write, on_stderr=tail.write,
                              max_output=max(4 * int(max_output), 64))
        return {
            "output": tail.text(),
            "truncated": tail.truncated,
            "exit_code": res.exit_code,
            "timed_out": res.timed_out,
            "duration_ms": res.duration_ms,
        }
    finally:
        if created is not None:
            try:
                created.kill()
            except SandboxNotFound:
                pass
            except CorralError:
                pass  # the sandbox's TTL (timeout + 60 s) ends it anyway
        elif sb is not None:
            try:
                sb.files.remove(path)
            except CorralError:
                pass


def call_tool(name: str, arguments: Union[str, Mapping[str, Any], None], **kwargs: Any) -> Dict[str, Any]:
    """Runs the tool a model called: ``name`` and its ``arguments`` (a
    dict, or the JSON string OpenAI sends). ``kwargs`` go to the tool
    (``sandbox=``, ``client=``, ``task=``, ``max_output=``)."""
    if name != EXECUTE_CODE_TOOL["name"]:
        raise ValueError(f"unknown tool {name!r}")
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
    unknown = set(args) - set(EXECUTE_CODE_SCHEMA["properties"])
    if unknown:
        raise ValueError(f"execute_code: unknown arguments {sorted(unknown)}")
    if "code" not in args:
        raise ValueError("execute_code: missing argument 'code'")
    timeout = args.get("timeout", 30)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"execute_code: timeout must be 1..{MAX_TIMEOUT} seconds")
    return execute_code(args["code"], timeout=timeout, language=args.get("language", "python"), **kwargs)
