"""Sandboxes: create, run commands (streamed), move files, run code,
snapshot, pause, kill."""

from __future__ import annotations

import base64
import codecs
import datetime as _dt
import http.client
import json
import os
import secrets as _secrets
import threading
import time
from typing import IO, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._http import CorralError, StreamBroken, b64decode, quote
from .client import SLOW_TIMEOUT, Client
from .errors import (APIError, BrakeError, CommandExitError, CommandTimeout, ConflictError,
                     NotFoundError, SandboxNotFound, error_for)
from .models import (CodeContext, CommandResult, EntryInfo, Execution, ExecutionError, Record,
                     Result)

DEFAULT_COMMAND_TIMEOUT = 60.0
"""Seconds a command may run when ``timeout`` is not given (as E2B's SDK)."""

DEFAULT_MAX_OUTPUT = 1 << 20
"""Bytes of each output stream a CommandResult keeps by default."""

DEFAULT_MAX_READ = 64 << 20
"""Bytes ``files.read`` returns at most (``download`` has no bound)."""

DEFAULT_CODE_TIMEOUT = 60.0
"""Seconds a code run may take when ``timeout`` is not given (the server's default)."""

STDIN_CHUNK = 64 << 10
EXIT_TIMEOUT = 124
EXIT_KILLED = 137
_BRAKES = ("budget_exhausted", "loop_detected", "task_ended")

OutputCallback = Callable[[str], Any]


def sandbox_not_found(e: APIError, end_reason: str = "") -> SandboxNotFound:
    """The SandboxNotFound form of a not_found error of a sandbox route."""
    if isinstance(e, SandboxNotFound):
        return e
    return SandboxNotFound(e.message or "sandbox not found", e.code or "not_found", e.status or 404,
                           end_reason=end_reason)


class Sandbox:
    """A sandbox on a corral server.

    ``Sandbox(...)`` creates and starts one (POST /v1/sandboxes); every
    argument is optional and defaults to the server's:

    - ``template``: template name or ``NAME:VERSION`` (default ``base``);
      ``snapshot``: start from a snapshot's files instead;
    - ``cpus`` (cores, fractional), ``memory_mb``, ``disk_mb``, ``pids``,
      ``nofile``, ``tier`` (light, medium, heavy), ``runtime`` (runc, gvisor);
    - ``timeout``: the sandbox's lifetime in seconds (default 300);
      ``command_timeout``: the default of REST exec calls;
    - ``envs`` (env vars of every process), ``metadata`` (string labels);
    - ``network`` (``none``, ``allow``, ``all-public``; ``allow=[...]``
      alone means ``allow``), ``allow`` (domains, ``*.pattern``,
      ``CIDR:port``), ``secrets`` (registered secret names);
    - ``task`` (a :class:`Task` or its id; without one the sandbox gets
      its own), ``agent`` (per-agent admission limits);
    - ``volumes`` (``[{"volume": NAME, "path": "/data"}]``),
      ``public_traffic``, ``auto_pause``;
    - ``client``, or ``url``/``api_key``/``ca_file`` for a new
      :class:`Client` (default: from the environment).

    ``with Sandbox(...) as sb:`` kills the sandbox when the block ends,
    also when it raises. ``sb.commands`` runs commands, ``sb.files``
    moves files, ``sb.run_code`` runs code in a ``code-interpreter``
    sandbox.
    """

    def __init__(self, template: Optional[str] = None, *, cpus: Optional[float] = None,
                 memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
                 pids: Optional[int] = None, nofile: Optional[int] = None,
                 timeout: Optional[float] = None, command_timeout: Optional[float] = None,
                 envs: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
                 network: Optional[str] = None, allow: Optional[Sequence[str]] = None,
                 secrets: Optional[Sequence[str]] = None, task: Any = None,
                 agent: Optional[str] = None, snapshot: Optional[str] = None,
                 runtime: Optional[str] = None, tier: Optional[str] = None,
                 volumes: Optional[Sequence[Mapping[str, str]]] = None,
                 public_traffic: Optional[bool] = None, auto_pause: Optional[bool] = None,
                 client: Optional[Client] = None, url: Optional[str] = None,
                 api_key: Optional[str] = None, ca_file: Optional[str] = None) -> None:
        self._client = client or Client(url, api_key, ca_file=ca_file)
        resources = {k: v for k, v in {"cpu": cpus, "memory_mb": memory_mb, "disk_mb": disk_mb,
                                       "pids": pids, "nofile": nofile}.items() if v is not None}
        if allow and network is None:
            network = "allow"
        body: Dict[str, Any] = {
            "template": template, "snapshot": snapshot, "runtime": runtime, "tier": tier,
            "resources": resources or None,
            "timeout": _whole_seconds(timeout), "command_timeout": _whole_seconds(command_timeout),
            "env": dict(envs) if envs else None, "metadata": dict(metadata) if metadata else None,
            "network": network, "allow": list(allow) if allow else None,
            "secrets": list(secrets) if secrets else None,
            "task": getattr(task, "id", task) or None, "agent": agent,
            "volumes": [dict(v) for v in volumes] if volumes else None,
            "public_traffic": public_traffic, "auto_pause": auto_pause,
        }
        body = {k: v for k, v in body.items() if v is not None}
        info = self._client._t.call("POST", "/v1/sandboxes", body, timeout=SLOW_TIMEOUT)
        self._bind(info)

    def _bind(self, info: Dict[str, Any]) -> None:
        self._info = Record(info)
        self.id: str = self._info["id"]
        self.commands = Commands(self)
        self.files = Files(self)

    @classmethod
    def connect(cls, sandbox_id: str, client: Optional[Client] = None, *,
                url: Optional[str] = None, api_key: Optional[str] = None) -> "Sandbox":
        """A Sandbox for an existing sandbox (``SandboxNotFound`` if it is
        unknown). Its context manager kills it too."""
        client = client or Client(url, api_key)
        sb = cls.__new__(cls)
        sb._client = client
        sb._bind(client.get_sandbox(sandbox_id))
        return sb

    @classmethod
    def list(cls, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
             client: Optional[Client] = None) -> List[Record]:
        """Sandboxes of the caller's team (see :meth:`Client.list_sandboxes`)."""
        return (client or Client()).list_sandboxes(state, metadata)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.kill()
        except SandboxNotFound:
            pass  # ended already (TTL, a breaker, killed elsewhere)
        except CorralError:
            if exc_type is None:
                raise
            # The block's own exception says more; do not mask it.

    def __repr__(self) -> str:
        return f"<corral.Sandbox {self.id} {self.state}>"

    # -- the sandbox object -------------------------------------------------

    @property
    def info(self) -> Record:
        """The sandbox object as last fetched (see docs/api.md)."""
        return self._info

    @property
    def client(self) -> Client:
        return self._client

    @property
    def state(self) -> str:
        """``running``, ``paused`` or ``ended``, as last fetched."""
        return self._info.get("state", "")

    @property
    def template(self) -> str:
        return self._info.get("template", "")

    @property
    def task_id(self) -> str:
        """The id of the sandbox's task."""
        return self._info.get("task", "")

    @property
    def metadata(self) -> Dict[str, str]:
        return dict(self._info.get("metadata") or {})

    @property
    def warnings(self) -> List[str]:
        """Warnings of the create (e.g. env vars that look like secrets)."""
        return list(self._info.get("warnings") or [])

    @property
    def end_reason(self) -> str:
        return self._info.get("end_reason", "")

    @property
    def expires_at(self) -> Optional[_dt.datetime]:
        from .models import parse_time
        return parse_time(self._info.get("expires_at"))

    def _path(self, suffix: str = "") -> str:
        return "/v1/sandboxes/" + quote(self.id) + suffix

    def _lifecycle(self, method: str, suffix: str, body: Any = None) -> Dict[str, Any]:
        try:
            return self._client._t.call(method, self._path(suffix), body, timeout=SLOW_TIMEOUT)
        except NotFoundError as e:
            raise sandbox_not_found(e) from None

    def refresh(self) -> Record:
        """Fetches the sandbox object again and returns it."""
        self._info = self._client.get_sandbox(self.id)
        return self._info

    def is_running(self) -> bool:
        """Fetches the sandbox and reports whether it runs."""
        try:
            return self.refresh().get("state") == "running"
        except SandboxNotFound:
            return False

    def kill(self) -> Record:
        """Kills the sandbox (SIGTERM, a grace period, SIGKILL, teardown)
        and returns it ended. :class:`SandboxNotFound` if it has ended."""
        self._info = Record(self._lifecycle("DELETE", ""))
        return self._info

    def set_timeout(self, seconds: float) -> Record:
        """Sets the sandbox's remaining lifetime to ``seconds`` from now."""
        self._info = Record(self._lifecycle("POST", "/timeout", {"timeout": _whole_seconds(seconds)}))
        return self._info

    def pause(self, persist: bool = False) -> Record:
        """Freezes every process (memory kept, no CPU, lifetime clock
        stopped); with ``persist=True`` saves the files and stops the
        processes instead (memory freed). Commands and files answer
        :class:`ConflictError` while paused."""
        body = {"persist": True} if persist else None
        self._info = Record(self._lifecycle("POST", "/pause", body))
        return self._info

    def resume(self, timeout: Optional[float] = None) -> Record:
        """Thaws a paused sandbox; its lifetime restarts at ``timeout``
        seconds, or at what was left when it was paused."""
        body = {"timeout": _whole_seconds(timeout)} if timeout else None
        self._info = Record(self._lifecycle("POST", "/resume", body))
        return self._info

    def snapshot(self, name: Optional[str] = None) -> Record:
        """Saves the sandbox's files as a snapshot (processes and memory
        are not saved) and returns it; ``Sandbox(snapshot=snap.id)``
        starts a sandbox from it."""
        return Record(self._lifecycle("POST", "/snapshots", {"name": name} if name else {}))

    def save_template(self, name: str, version: Optional[str] = None) -> Record:
        """Saves the sandbox's files as template version ``name:version``
        (``name`` may be ``NAME:VERSION`` itself; without a version one is
        made from the time, ``YYYYMMDD-HHMMSS-xxxx``) and returns it.
        The template is private to the sandbox's team."""
        ref = name
        if ":" not in name:
            version = version or time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + _secrets.token_hex(2)
            ref = f"{name}:{version}"
        return Record(self._lifecycle("POST", "/template", {"ref": ref}))

    def exec(self, command: Union[str, Sequence[str]], *, cwd: Optional[str] = None,
             envs: Optional[Mapping[str, str]] = None, user: Optional[str] = None,
             stdin: Union[str, bytes, None] = None, timeout: Optional[float] = None) -> Record:
        """Runs a command to completion through the REST exec route (one
        call, no streaming) and returns its answer: ``exit_code``,
        ``stdout``, ``stderr``, ``truncated``, ``timed_out``,
        ``duration_ms``, ``warnings`` (the loop detector's notes). A string
        runs under ``/bin/bash -lc``; a list is an argv. ``timeout`` 0
        means none; None the sandbox's ``command_timeout``."""
        body: Dict[str, Any] = {"cmd": list(command)} if not isinstance(command, str) else {"command": command}
        if cwd:
            body["cwd"] = cwd
        if envs:
            body["env"] = dict(envs)
        if user:
            body["user"] = user
        if stdin is not None:
            body["stdin"] = base64.b64encode(_to_bytes(stdin)).decode()
        if timeout is not None:
            body["timeout"] = _whole_seconds(timeout) if timeout > 0 else 0
        http_timeout = None if timeout is None or timeout <= 0 else timeout + 60
        try:
            return Record(self._client._t.call("POST", self._path("/exec"), body,
                                               timeout=http_timeout or SLOW_TIMEOUT))
        except NotFoundError as e:
            raise sandbox_not_found(e) from None

    # -- agent API plumbing -------------------------------------------------

    def _agent(self, rpc: str) -> str:
        return self._path("/agent/" + rpc)

    def _agent_error(self, e: APIError) -> APIError:
        """A not_found of an agent call names the sandbox only when the
        sandbox is not running (else it is a missing file or process)."""
        if not isinstance(e, NotFoundError) or isinstance(e, SandboxNotFound):
            return e
        try:
            info = self._client.get_sandbox(self.id)
        except SandboxNotFound:
            return sandbox_not_found(e)
        except CorralError:
            return e
        if info.get("state") == "ended":
            return sandbox_not_found(e, info.get("end_reason", ""))
        return e

    def _unary(self, rpc: str, msg: Mapping[str, Any], user: Optional[str] = None) -> Dict[str, Any]:
        try:
            return self._client._t.unary(self._agent(rpc), msg, user=user)
        except APIError as e:
            raise self._agent_error(e) from None

    # -- code runs ------------------------------------------------------------

    def run_code(self, code: str, *, timeout: Optional[float] = DEFAULT_CODE_TIMEOUT,
                 context: Union[CodeContext, str, None] = None, language: Optional[str] = None,
                 envs: Optional[Mapping[str, str]] = None,
                 on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None) -> Execution:
        """Runs code in the sandbox's code interpreter (a sandbox of the
        ``code-interpreter`` template) and returns an :class:`Execution`:
        ``results`` (text, png bytes, html, data, ...), ``logs``, ``error``
        (name, value, traceback; ``TimeoutError`` when ``timeout`` seconds
        passed, after which the context stays usable), ``truncated``,
        ``timed_out``, ``oom``, ``duration_ms``. A run is a tool call of
        the sandbox's task. ``context`` (a :class:`CodeContext` or its id)
        keeps state between runs; ``language`` picks the default context
        of a language instead (not both). With callbacks the run is
        streamed and they are called as its output comes."""
        body: Dict[str, Any] = {"code": code}
        ctx_id = getattr(context, "id", context)
        if ctx_id:
            body["context_id"] = ctx_id
        if language:
            body["language"] = language
        if envs:
            body["env_vars"] = dict(envs)
        if timeout:
            body["timeout"] = float(timeout)
        http_timeout = (float(timeout) if timeout else DEFAULT_CODE_TIMEOUT) + 60
        stream = any(cb is not None for cb in (on_stdout, on_stderr, on_result, on_error))
        if not stream:
            try:
                return Execution.from_wire(self._client._t.call("POST", self._path("/code"), body,
                                                                timeout=http_timeout))
            except APIError as e:
                raise self._agent_error(e) from None
        body["stream"] = True
        try:
            conn, resp = self._client._t.open(
                "POST", self._path("/code"), body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"}, timeout=http_timeout)
        except APIError as e:
            raise self._agent_error(e) from None
        started = time.monotonic()
        try:
            ex = execution_from_lines(_lines(resp), on_stdout, on_stderr, on_result, on_error)
        finally:
            conn.close()
        ex.duration_ms = int((time.monotonic() - started) * 1000)
        return ex

    def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> CodeContext:
        """Creates an interpreter context (its own variables) of a language
        (default python), working in ``cwd``."""
        body = {k: v for k, v in {"language": language, "cwd": cwd}.items() if v}
        d = self._code_call("POST", "/code/contexts", body)
        return CodeContext(d.get("id", ""), d.get("language", ""), d.get("cwd", ""))

    def list_code_contexts(self) -> List[CodeContext]:
        """The interpreter's contexts."""
        out = self._code_call("GET", "/code/contexts") or []
        if isinstance(out, dict):
            out = out.get("contexts") or []
        return [CodeContext(d.get("id", ""), d.get("language", ""), d.get("cwd", "")) for d in out]

    def restart_code_context(self, context: Union[CodeContext, str]) -> None:
        """Restarts a context (its state is lost)."""
        self._code_call("POST", "/code/contexts/" + quote(getattr(context, "id", context)) + "/restart")

    def remove_code_context(self, context: Union[CodeContext, str]) -> None:
        """Removes a context."""
        self._code_call("DELETE", "/code/contexts/" + quote(getattr(context, "id", context)))

    def _code_call(self, method: str, suffix: str, body: Any = None) -> Any:
        try:
            return self._client._t.call(method, self._path(suffix), body)
        except APIError as e:
            raise self._agent_error(e) from None


def _lines(resp: Any) -> Iterable[bytes]:
    try:
        for line in resp:
            yield line
    except (OSError, http.client.HTTPException) as e:
        raise StreamBroken(f"the code run's stream broke: {e}") from e


def execution_from_lines(lines: Iterable[bytes], on_stdout: Optional[OutputCallback] = None,
                         on_stderr: Optional[OutputCallback] = None,
                         on_result: Optional[Callable[[Result], Any]] = None,
                         on_error: Optional[Callable[[ExecutionError], Any]] = None) -> Execution:
    """Builds an Execution from a streamed run's NDJSON lines (E2B's
    /execute shape), calling the callbacks as lines come. A cut stream
    keeps what came and is ``truncated``."""
    ex = Execution()
    for raw in lines:
        raw = raw.strip()
        if not raw:
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        kind = line.get("type")
        if kind == "stdout":
            ex.logs.stdout.append(line.get("text", ""))
            if on_stdout:
                on_stdout(line.get("text", ""))
        elif kind == "stderr":
            text = line.get("text", "")
            ex.logs.stderr.append(text)
            if text.startswith("[corral: output truncated"):
                ex.truncated = True
            if on_stderr:
                on_stderr(text)
        elif kind == "result":
            r = Result.from_wire(line)
            ex.results.append(r)
            if on_result:
                on_result(r)
        elif kind == "error":
            err = ExecutionError(line.get("name", ""), line.get("value", ""), line.get("traceback", ""))
            if ex.error is None:
                ex.error = err
            ex.timed_out = ex.timed_out or err.name == "TimeoutError"
            ex.oom = ex.oom or err.name == "OutOfMemoryError"
            ex.truncated = ex.truncated or err.name == "UnexpectedEndOfExecution"
            if on_error:
                on_error(err)
        elif kind == "number_of_executions":
            ex.execution_count = line.get("execution_count")
    return ex


class Commands:
    """Runs commands in a sandbox through its agent (streamed)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def run(self, cmd: str, *, timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT,
            cwd: Optional[str] = None, envs: Optional[Mapping[str, str]] = None,
            user: Optional[str] = None, on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, background: bool = False,
            stdin: Union[str, bytes, None] = None, args: Optional[Sequence[str]] = None,
            check: bool = True, max_output: int = DEFAULT_MAX_OUTPUT):
        """Runs ``cmd`` under ``/bin/bash -l -c`` (or, with ``args``, runs
        the program ``cmd`` with those arguments, no shell).

        ``timeout`` seconds (default 60; 0 or None for none) kill the
        command's process group; ``cwd``, ``envs`` and ``user`` (``user``,
        the default, or ``root``) set where, with what and as whom it
        runs. ``on_stdout``/``on_stderr`` get output as it comes, as
        text, in order, from one thread. ``stdin`` is written to the
        command's stdin, which is then closed.

        Returns a :class:`CommandResult`; with ``check`` (the default) a
        non-zero exit raises :class:`CommandExitError` and a timeout
        :class:`CommandTimeout`, both carrying the result. With
        ``background=True`` it returns a :class:`CommandHandle` as soon as
        the command runs (stdin stays open for ``send_stdin``); the
        callbacks then run on the handle's reader thread.
        """
        h = self._start(cmd, args=args, timeout=timeout, cwd=cwd, envs=envs, user=user,
                        stdin=background or stdin is not None, max_output=max_output,
                        on_stdout=on_stdout, on_stderr=on_stderr, check=check)
        if background:
            h._thread = threading.Thread(target=h._consume_background, name=f"corral-cmd-{h.pid}",
                                         daemon=True)
            h._thread.start()
            if stdin is not None:
                h.send_stdin(stdin)
                h.close_stdin()
            return h
        try:
            if stdin is not None:
                h.send_stdin(stdin)
                h.close_stdin()
            h._consume()
        except BaseException:
            # Interrupted (KeyboardInterrupt, a callback raised): the
            # command must not outlive its caller.
            h._kill_quietly()
            raise
        finally:
            h._done.set()
        return h.wait()

    def _start(self, cmd: str, *, args: Optional[Sequence[str]], timeout: Optional[float],
               cwd: Optional[str], envs: Optional[Mapping[str, str]], user: Optional[str],
               stdin: bool, max_output: int, on_stdout: Optional[OutputCallback],
               on_stderr: Optional[OutputCallback], check: bool) -> "CommandHandle":
        if not cmd:
            raise error_for("invalid_argument", "empty command", 400)
        proc: Dict[str, Any] = {"cmd": cmd, "args": list(args)} if args is not None else \
            {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}
        if envs:
            proc["envs"] = {str(k): str(v) for k, v in envs.items()}
        if cwd:
            proc["cwd"] = cwd
        timeout_ms = int(timeout * 1000) if timeout and timeout > 0 else None
        sb = self._sb
        try:
            stream = sb._client._t.server_stream(
                sb._agent("process.Process/Start"), {"process": proc, "stdin": bool(stdin)},
                user=user, timeout_ms=timeout_ms, headers={"Keepalive-Ping-Interval": "30"})
        except APIError as e:
            raise sb._agent_error(e) from None
        it = iter(stream)
        pid = 0
        try:
            while not pid:
                ev = next(it).get("event") or {}
                if "start" in ev:
                    pid = int((ev["start"] or {}).get("pid") or 0)
                    if not pid:
                        raise CorralError("the command's start event has no pid")
                elif "keepalive" not in ev:
                    raise CorralError(f"expected the command's start event, got {sorted(ev)}")
        except StopIteration:
            stream.close()
            raise CorralError("the command's stream ended before its start event") from None
        except APIError as e:
            stream.close()
            raise sb._agent_error(e) from None
        except BaseException:
            stream.close()
            raise
        return CommandHandle(sb, pid, stream, it, max_output, on_stdout, on_stderr, check)

    def list(self) -> List[Record]:
        """The processes started through the agent that still run:
        ``pid``, ``tag``, ``cmd``, ``args``, ``envs``, ``cwd``."""
        out = self._sb._unary("process.Process/List", {})
        procs = []
        for p in out.get("processes") or []:
            c = p.get("config") or {}
            procs.append(Record(pid=int(p.get("pid") or 0), tag=p.get("tag", ""), cmd=c.get("cmd", ""),
                                args=list(c.get("args") or []), envs=dict(c.get("envs") or {}),
                                cwd=c.get("cwd", "")))
        return procs

    def kill(self, pid: int) -> bool:
        """Sends SIGKILL to process ``pid``; False if it is not running."""
        try:
            self._sb._unary("process.Process/SendSignal",
                            {"process": {"pid": int(pid)}, "signal": "SIGNAL_SIGKILL"})
        except NotFoundError as e:
            if isinstance(e, SandboxNotFound):
                raise
            return False
        return True

    def send_stdin(self, pid: int, data: Union[str, bytes]) -> None:
        """Writes data to the stdin of process ``pid`` (in 64 KiB chunks)."""
        b = _to_bytes(data)
        first = True
        while first or b:
            first = False
            chunk, b = b[:STDIN_CHUNK], b[STDIN_CHUNK:]
            self._sb._unary("process.Process/SendInput", {
                "process": {"pid": int(pid)},
                "input": {"stdin": base64.b64encode(chunk).decode()}})

    def close_stdin(self, pid: int) -> None:
        """Closes the stdin of process ``pid`` (it reads end of file)."""
        self._sb._unary("process.Process/CloseStdin", {"process": {"pid": int(pid)}})


class _Tail:
    """The last ``max`` bytes of a stream, and the count of all."""

    def __init__(self, max_bytes: int) -> None:
        self.max = max(0, max_bytes)
        self.buf = bytearray()
        self.total = 0

    def write(self, b: bytes) -> None:
        self.total += len(b)
        if self.max <= 0:
            return
        self.buf += b
        if len(self.buf) > self.max:
            del self.buf[:len(self.buf) - self.max]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.buf)

    def text(self) -> str:
        return decode_tail(bytes(self.buf), self.truncated)


def decode_tail(b: bytes, cut: bool) -> str:
    """Decodes UTF-8 bytes; when ``cut`` (the head was dropped), up to 3
    continuation bytes at the start (the rest of a cut character) are
    skipped rather than replaced."""
    if cut:
        i = 0
        while i < min(3, len(b)) and (b[i] & 0xC0) == 0x80:
            i += 1
        b = b[i:]
    return b.decode("utf-8", "replace")


class CommandHandle:
    """A running command (``commands.run(..., background=True)``)."""

    def __init__(self, sb: Sandbox, pid: int, stream: Any, it: Any, max_output: int,
                 on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback],
                 check: bool) -> None:
        self._sb = sb
        self.pid = pid
        """The command's process id in the sandbox."""
        self._stream = stream
        self._it = it
        self._stdout = _Tail(max_output)
        self._stderr = _Tail(max_output)
        self._dec_out = codecs.getincrementaldecoder("utf-8")("replace")
        self._dec_err = codecs.getincrementaldecoder("utf-8")("replace")
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._check = check
        self._end: Optional[Dict[str, Any]] = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started = time.monotonic()
        self._ended = 0.0
        self._result: Optional[CommandResult] = None
        self._callback_error: Optional[BaseException] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<corral.CommandHandle pid={self.pid} {'done' if self.done else 'running'}>"

    @property
    def done(self) -> bool:
        """True once the command's stream has ended."""
        return self._done.is_set()

    def _consume(self) -> None:
        try:
            for msg in self._it:
                ev = msg.get("event") or {}
                if "data" in ev:
                    d = ev["data"] or {}
                    for key, tail, dec, cb in (("stdout", self._stdout, self._dec_out, self._on_stdout),
                                               ("pty", self._stdout, self._dec_out, self._on_stdout),
                                               ("stderr", self._stderr, self._dec_err, self._on_stderr)):
                        if d.get(key):
                            b = b64decode(d[key])
                            tail.write(b)
                            if cb is not None:
                                s = dec.decode(b)
                                if s:
                                    cb(s)
                elif "end" in ev:
                    self._end = ev["end"] or {}
                    self._ended = time.monotonic()
        except (StreamBroken, APIError) as e:
            if self._end is None:
                self._error = e
        finally:
            self._ended = self._ended or time.monotonic()
            self._stream.close()

    def _consume_background(self) -> None:
        try:
            self._consume()
        except BaseException as e:
            # A callback raised on the reader thread: the command must not
            # run on unobserved, and wait() raises what the callback did.
            self._callback_error = e
            self._kill_quietly()
        finally:
            self._done.set()

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Waits for the command to end and returns its result, raising as
        ``run`` does (:class:`CommandExitError`, :class:`CommandTimeout`
        with ``check``). ``timeout`` bounds the wait in seconds (the
        builtin ``TimeoutError`` when it passes; the command goes on)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"command {self.pid} still runs after {timeout} s")
        with self._lock:
            if self._result is None:
                self._result = self._finish()
        res = self._result
        if self._callback_error is not None:
            raise self._callback_error
        if self._error is not None:
            raise self._error
        if self._check and res.timed_out:
            raise CommandTimeout(res, f"command timed out (exit code {res.exit_code})")
        if self._check and res.exit_code != 0:
            raise CommandExitError(res)
        return res

    def _finish(self) -> CommandResult:
        res = CommandResult(pid=self.pid)
        res.stdout, res.stdout_bytes = self._stdout.text(), self._stdout.total
        res.stderr, res.stderr_bytes = self._stderr.text(), self._stderr.total
        res.truncated = self._stdout.truncated or self._stderr.truncated
        res.duration_ms = int((self._ended - self._started) * 1000)
        if self._end is not None:
            apply_end(res, self._end)
            self._error = None
            return res
        if self._callback_error is not None:
            return res
        # The stream broke: the sandbox may have ended under the command.
        cause = self._error
        info = self._sandbox_after_break()
        if info is not None and info.get("state") == "ended":
            res.exit_code = EXIT_KILLED
            res.end_reason = info.get("end_reason") or "killed"
            msg = f"sandbox {self._sb.id} ended ({res.end_reason}) while the command ran"
            if res.end_reason in _BRAKES:
                self._error = error_for(res.end_reason, msg + self._breaker_reason(info), 403)
            else:
                self._error = SandboxNotFound(msg, end_reason=res.end_reason)
            self._error.result = res  # type: ignore[attr-defined]
        elif cause is None:
            self._error = StreamBroken("the command's stream ended without a result")
        return res

    def _sandbox_after_break(self) -> Optional[Record]:
        """The sandbox's object after the command's stream broke. The
        server cuts a stream as it starts to kill the sandbox, so a
        sandbox that still reads as running is asked again for a few
        seconds before the break is taken as the connection's."""
        deadline = time.monotonic() + 5
        while True:
            try:
                info = self._sb._client.get_sandbox(self._sb.id)
            except SandboxNotFound:
                return Record(state="ended", end_reason="killed")
            except CorralError:
                return None
            if info.get("state") != "running" or time.monotonic() > deadline:
                return info
            time.sleep(0.2)

    def _breaker_reason(self, info: Mapping[str, Any]) -> str:
        task = info.get("task")
        if not task:
            return ""
        try:
            t = self._sb._client._t.call("GET", "/v1/tasks/" + quote(task)) or {}
        except CorralError:
            return ""
        reason = (t.get("breaker") or {}).get("reason") or ""
        return ": " + reason if reason else ""

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes data to the command's stdin."""
        self._sb.commands.send_stdin(self.pid, data)

    def close_stdin(self) -> None:
        """Closes the command's stdin."""
        self._sb.commands.close_stdin(self.pid)

    def kill(self) -> bool:
        """Sends SIGKILL to the command; False if it had ended."""
        return self._sb.commands.kill(self.pid)

    def _kill_quietly(self) -> None:
        try:
            self.kill()
        except CorralError:
            pass
        self._stream.close()

    def disconnect(self) -> None:
        """Stops receiving the command's output; the command goes on."""
        self._stream.close()


# Linux signal names as the agent's status text spells them ("signal: killed").
_SIGNALS = {
    "hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4, "trace/breakpoint trap": 5,
    "aborted": 6, "bus error": 7, "floating point exception": 8, "killed": 9,
    "user defined signal 1": 10, "segmentation fault": 11, "user defined signal 2": 12,
    "broken pipe": 13, "alarm clock": 14, "terminated": 15,
}


def apply_end(res: CommandResult, end: Mapping[str, Any]) -> None:
    """Fills the exit fields of res from a process end event (protobuf
    JSON: exitCode, exited, status, timedOut, endReason)."""
    res.status = end.get("status", "")
    res.end_reason = end.get("endReason") or end.get("end_reason") or ""
    res.timed_out = bool(end.get("timedOut") or end.get("timed_out"))
    code = int(end.get("exitCode") or end.get("exit_code") or 0)
    if res.timed_out:
        res.exit_code = EXIT_TIMEOUT
        res.end_reason = res.end_reason or "timeout"
    elif end.get("exited"):
        res.exit_code = code
    else:
        sig = _signal(res.status)
        if sig:
            res.exit_code = 128 + sig
        elif code > 0:
            res.exit_code = code
        elif res.end_reason in ("oom", "killed"):
            res.exit_code = EXIT_KILLED
        else:
            res.exit_code = code


def _signal(status: str) -> int:
    s = status.strip()
    if not s.startswith("signal: "):
        return 0
    s = s[len("signal: "):]
    if s.endswith(" (core dumped)"):
        s = s[:-len(" (core dumped)")]
    if s in _SIGNALS:
        return _SIGNALS[s]
    if s.startswith("signal "):
        try:
            n = int(s[len("signal "):])
            return n if 0 < n < 128 else 0
        except ValueError:
            return 0
    return 0


class Files:
    """A sandbox's filesystem, through its agent. Relative paths are
    resolved against the user's home; ``user`` (default ``user``, or
    ``root``) is whom an operation runs as, and who owns what it makes."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _files_query(self, path: str, user: Optional[str]) -> Dict[str, str]:
        q = {"path": path}
        if user:
            q["username"] = user
        return q

    def read(self, path: str, format: str = "text", *, user: Optional[str] = None,
             max_size: int = DEFAULT_MAX_READ) -> Union[str, bytes]:
        """A file's content: ``format="text"`` (UTF-8, the default) or
        ``"bytes"``. Larger than ``max_size`` bytes (64 MiB): use
        :meth:`download`. A missing file raises :class:`NotFoundError`."""
        if format not in ("text", "bytes"):
            raise ValueError(f"format {format!r}: want 'text' or 'bytes'")
        sb = self._sb
        try:
            conn, resp = sb._client._t.open("GET", sb._agent("files"), query=self._files_query(path, user),
                                            timeout=SLOW_TIMEOUT)
        except APIError as e:
            raise sb._agent_error(e) from None
        try:
            data = bytearray()
            while len(data) <= max_size:
                chunk = resp.read(min(64 << 10, max_size + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
        except (OSError, http.client.HTTPException) as e:
            raise CorralError(f"reading {path}: {e}") from e
        finally:
            conn.close()
        if len(data) > max_size:
            raise CorralError(f"{path} is over {max_size} bytes: use files.download")
        if resp.length not in (None, 0):
            raise CorralError(f"reading {path}: the answer was cut")
        return data.decode("utf-8") if format == "text" else bytes(data)

    def download(self, path: str, fileobj: IO[bytes], *, user: Optional[str] = None) -> int:
        """Copies a file's content into ``fileobj`` (opened for binary
        writing) and returns the number of bytes."""
        sb = self._sb
        try:
            conn, resp = sb._client._t.open("GET", sb._agent("files"), query=self._files_query(path, user),
                                            timeout=SLOW_TIMEOUT)
        except APIError as e:
            raise sb._agent_error(e) from None
        n = 0
        try:
            while True:
                chunk = resp.read(64 << 10)
                if not chunk:
                    break
                fileobj.write(chunk)
                n += len(chunk)
        except (OSError, http.client.HTTPException) as e:
            raise CorralError(f"downloading {path}: {e}") from e
        finally:
            conn.close()
        if resp.length not in (None, 0):
            raise CorralError(f"downloading {path}: the answer was cut")
        return n

    def write(self, path: str, data: Union[str, bytes, IO[bytes]], *, user: Optional[str] = None) -> None:
        """Creates or overwrites a file with ``data`` (str as UTF-8, bytes,
        or a binary file object), creating parent directories."""
        if isinstance(data, (str, bytes, bytearray, memoryview)):
            body = _to_bytes(data)
            self._upload(path, body, len(body), user)
        else:
            self.upload(path, data, user=user)

    def upload(self, path: str, fileobj: IO[bytes], *, user: Optional[str] = None) -> None:
        """Creates or overwrites a file with the content of ``fileobj``
        (opened for binary reading), streamed; at most 100 MiB."""
        length = None
        try:
            pos = fileobj.tell()
            length = os.fstat(fileobj.fileno()).st_size - pos
        except (AttributeError, OSError, ValueError):
            try:
                pos = fileobj.tell()
                fileobj.seek(0, os.SEEK_END)
                length = fileobj.tell() - pos
                fileobj.seek(pos)
            except (AttributeError, OSError, ValueError):
                length = None
        self._upload(path, fileobj, length, user)

    def _upload(self, path: str, body: Any, length: Optional[int], user: Optional[str]) -> None:
        sb = self._sb
        headers = {"Content-Type": "application/octet-stream"}
        if length is not None:
            headers["Content-Length"] = str(length)
        try:
            conn, resp = sb._client._t.open("POST", sb._agent("files"), query=self._files_query(path, user),
                                            body=body, headers=headers, timeout=SLOW_TIMEOUT)
        except APIError as e:
            raise sb._agent_error(e) from None
        try:
            resp.read(1 << 20)
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()

    def list(self, path: str, depth: int = 1, *, user: Optional[str] = None) -> List[EntryInfo]:
        """The entries under directory ``path``, down to ``depth`` levels."""
        out = self._sb._unary("filesystem.Filesystem/ListDir", {"path": path, "depth": max(1, int(depth))}, user)
        return [EntryInfo.from_wire(e) for e in out.get("entries") or []]

    def get_info(self, path: str, *, user: Optional[str] = None) -> EntryInfo:
        """Describes ``path`` (:class:`NotFoundError` if missing)."""
        out = self._sb._unary("filesystem.Filesystem/Stat", {"path": path}, user)
        return EntryInfo.from_wire(out.get("entry") or {})

    def exists(self, path: str, *, user: Optional[str] = None) -> bool:
        """Whether ``path`` exists."""
        try:
            self.get_info(path, user=user)
        except NotFoundError as e:
            if isinstance(e, SandboxNotFound):
                raise
            return False
        return True

    def make_dir(self, path: str, *, user: Optional[str] = None) -> bool:
        """Creates directory ``path`` and its parents; False if it existed."""
        try:
            self._sb._unary("filesystem.Filesystem/MakeDir", {"path": path}, user)
        except ConflictError as e:
            if e.code == "already_exists":
                return False
            raise
        return True

    def rename(self, old_path: str, new_path: str, *, user: Optional[str] = None) -> EntryInfo:
        """Moves ``old_path`` to ``new_path`` and returns the moved entry."""
        out = self._sb._unary("filesystem.Filesystem/Move", {"source": old_path, "destination": new_path}, user)
        return EntryInfo.from_wire(out.get("entry") or {})

    def remove(self, path: str, *, user: Optional[str] = None) -> None:
        """Removes ``path``, recursively; a missing path is no error."""
        try:
            self._sb._unary("filesystem.Filesystem/Remove", {"path": path}, user)
        except NotFoundError as e:
            if isinstance(e, SandboxNotFound):
                raise


def _to_bytes(data: Union[str, bytes, bytearray, memoryview]) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _whole_seconds(s: Optional[float]) -> Optional[int]:
    """Seconds for the API, rounded up so a positive value never becomes 0."""
    if s is None:
        return None
    n = int(s)
    return n + 1 if n < s else n
