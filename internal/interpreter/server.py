#!/usr/bin/python3
# corral's code-interpreter server. It runs inside a sandbox of the
# code-interpreter template, as the sandbox user, listening on port 49999 in
# the sandbox's own network namespace (the control plane in front of it checks
# the caller's credentials), and speaks E2B's code-interpreter protocol:
#
#   GET    /health                  200 "OK"
#   POST   /execute                 run code in a context, NDJSON stream
#   POST   /contexts                create a context {language?, cwd?}
#   GET    /contexts                list contexts
#   POST   /contexts/{id}/restart   restart a context's kernel (state cleared)
#   DELETE /contexts/{id}           remove a context
#
# Every context is a Jupyter kernel (ipykernel) driven with jupyter_client.
# Only Python's standard library and Debian's python3-jupyter-client are used.
# docs/interpreter.md describes the protocol, the limits and the errors.

import datetime
import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _env_int(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def _env_float(name, default):
    try:
        return float(os.environ.get(name, ""))
    except ValueError:
        return default


# Limits (docs/interpreter.md, "Limits"); each has an environment override.
PORT = _env_int("CORRAL_INTERPRETER_PORT", 49999)
HOST = os.environ.get("CORRAL_INTERPRETER_HOST", "0.0.0.0")
DEFAULT_CWD = "/home/user"
KEEPALIVE_SECONDS = 5.0
POLL_SECONDS = 0.1
# How long an interrupted run may take to stop before its kernel is restarted.
INTERRUPT_GRACE_SECONDS = _env_float("CORRAL_INTERPRETER_INTERRUPT_GRACE", 5.0)
# How often the interrupt is sent again, within the grace, to a run that
# has not stopped: IPython swallows a KeyboardInterrupt raised in its
# event callbacks (pre_execute, pre_run_cell: right after the run starts),
# and the code then runs on as if it had never been interrupted.
INTERRUPT_RESEND_SECONDS = 1.0
# How long a run that is to be interrupted (its timeout passed, or its
# client left) may wait for the kernel to start executing it — the only
# time an interrupt can reach it — before the kernel is restarted.
RUN_START_GRACE_SECONDS = _env_float("CORRAL_INTERPRETER_RUN_START_GRACE", 30.0)
KERNEL_START_SECONDS = 60.0
MAX_BODY_BYTES = _env_int("CORRAL_INTERPRETER_MAX_BODY", 8 << 20)
MAX_STREAM_TEXT = _env_int("CORRAL_INTERPRETER_MAX_STREAM_TEXT", 64 << 10)
MAX_RESULT_BYTES = _env_int("CORRAL_INTERPRETER_MAX_RESULT", 16 << 20)
MAX_RUN_BYTES = _env_int("CORRAL_INTERPRETER_MAX_RUN", 64 << 20)
MAX_CONTEXTS = _env_int("CORRAL_INTERPRETER_MAX_CONTEXTS", 32)
MAX_ENV_VARS = 256
MAX_DATA_CELLS = 100_000

KERNELS = {"python": "python3"}
LANGUAGE_ALIASES = {"": "python", "python": "python", "python3": "python", "py": "python",
                    "ipython": "python", "js": "javascript", "ts": "typescript"}

# MIME type -> result field (E2B's names); any other MIME type goes to "extra".
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

# Runs silently in every new kernel: the e2b/data formatter for pandas data
# frames, the e2b/chart formatter for matplotlib figures, and a higher OOM
# score so that a memory bomb kills the kernel rather than this server.
KERNEL_SETUP = r'''
def __corral_setup():
    import json
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("800")
    except OSError:
        pass
    ip = get_ipython()

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        def _check_return(self, r, obj):
            return r if isinstance(r, dict) else None

    class ChartFormatter(BaseFormatter):
        # Not registered by type: the inline backend removes every
        # formatter's printer for Figure when pyplot is first imported.
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        def __call__(self, obj):
            if not self.enabled or not any(c.__name__ == "Figure" and c.__module__ == "matplotlib.figure" for c in type(obj).__mro__):
                return None
            try:
                r = chart(obj)
            except Exception:
                return None
            return r if isinstance(r, dict) else None

    def frame(df):
        if df.size > %(max_cells)d:
            return None
        out = {}
        for i, col in enumerate(df.columns):
            out[str(col)] = json.loads(df.iloc[:, i].to_json(orient="values", date_format="iso", default_handler=str))
        return out

    def _num(v):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        return f if f == f and f not in (float("inf"), float("-inf")) else None

    def chart(fig):
        axes = fig.get_axes()
        if len(axes) != 1:
            return {"type": "superchart" if axes else "unknown", "title": fig._suptitle.get_text() if fig._suptitle else "",
                    "elements": [c for c in (chart_axes(a) for a in axes) if c]} if axes else None
        return chart_axes(axes[0])

    def chart_axes(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.patches import Rectangle, Wedge
        base = {"title": ax.get_title(), "x_label": ax.get_xlabel(), "y_label": ax.get_ylabel()}
        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges:
            labels = [t.get_text() for t in ax.texts]
            els = []
            for i, w in enumerate(wedges):
                els.append({"label": labels[i] if i < len(labels) else "", "angle": _num(abs(w.theta2 - w.theta1)), "radius": _num(w.r)})
            return dict(base, type="pie", elements=els)
        bars = [p for p in ax.patches if isinstance(p, Rectangle)]
        if bars and not ax.lines:
            ticks = {round(t, 6): l.get_text() for t, l in zip(ax.get_xticks(), ax.get_xticklabels())}
            els = []
            for b in bars:
                x = b.get_x() + b.get_width() / 2
                els.append({"label": ticks.get(round(x, 6), str(_num(x))), "value": _num(b.get_height()), "group": b.get_label() if not b.get_label().startswith("_") else ""})
            return dict(base, type="bar", elements=els)
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        if scatters and not ax.lines:
            els = []
            for c in scatters:
                pts = [[_num(x), _num(y)] for x, y in c.get_offsets().tolist()]
                els.append({"label": c.get_label() if not c.get_label().startswith("_") else "", "points": pts})
            return dict(base, type="scatter", elements=els)
        if ax.lines:
            els = []
            for l in ax.lines:
                xs, ys = l.get_xdata(), l.get_ydata()
                els.append({"label": l.get_label() if not l.get_label().startswith("_") else "",
                            "points": [[_num(x), _num(y)] for x, y in zip(list(xs), list(ys))]})
            return dict(base, type="line", x_scale=ax.get_xscale(), y_scale=ax.get_yscale(), elements=els)
        return dict(base, type="unknown", elements=[])

    def safe(fn):
        def wrapped(obj):
            try:
                return fn(obj)
            except Exception:
                return None
        return wrapped

    data = DataFormatter(parent=ip.display_formatter)
    data.for_type_by_name("pandas.core.frame", "DataFrame", safe(frame))
    ip.display_formatter.formatters["e2b/data"] = data
    ip.display_formatter.formatters["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)

__corral_setup()
del __corral_setup
''' % {"max_cells": MAX_DATA_CELLS}


def log(*args):
    print("corral-interpreter:", *args, file=sys.stderr, flush=True)


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class HTTPError(Exception):
    """A request refused with a status and a plain-text message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def normalize_language(lang):
    """Returns the kernel language for a request's language, or raises 400."""
    if lang is None:
        lang = ""
    if not isinstance(lang, str):
        raise HTTPError(400, "language must be a string")
    key = lang.strip().lower()
    name = LANGUAGE_ALIASES.get(key, key)
    if name not in KERNELS:
        raise HTTPError(400, "language %r is not supported by this template; available: %s"
                        % (lang, ", ".join(sorted(KERNELS))))
    return name


class Run:
    """One /execute: the lines the context's worker produces for it."""

    def __init__(self, code, env_vars, timeout):
        self.code = code
        self.env_vars = env_vars
        self.timeout = timeout
        self.lines = queue.Queue()
        # Set by the request thread when the client has gone, or by a
        # restart or removal of the context; cancel_reason says which.
        self.cancel = threading.Event()
        self.cancel_reason = None
        self.sent = 0
        self.truncated = False
        self.done = threading.Event()

    def abort(self, reason):
        if not self.cancel.is_set():
            self.cancel_reason = reason
            self.cancel.set()

    def emit(self, line):
        """Queues one line, within the run's output bound."""
        if self.cancel.is_set() and self.cancel_reason == "disconnect":
            return
        b = len(json.dumps(line))
        if line["type"] in ("result",) and b > MAX_RESULT_BYTES:
            line = bound_result(line)
            b = len(json.dumps(line))
        if self.sent + b > MAX_RUN_BYTES and line["type"] not in ("error", "number_of_executions"):
            if not self.truncated:
                self.truncated = True
                self.lines.put({"type": "stderr", "timestamp": now_iso(),
                                "text": "[corral: output truncated: this run's output passed %d bytes; later output is dropped]\n" % MAX_RUN_BYTES})
            return
        self.sent += b
        self.lines.put(line)

    def finish(self):
        self.lines.put(None)
        self.done.set()


def bound_result(line):
    """Replaces the biggest fields of an oversized result by a marker."""
    out = {"type": "result", "is_main_result": line.get("is_main_result", False)}
    dropped = []
    budget = MAX_RESULT_BYTES - 4096
    fields = sorted(((k, v) for k, v in line.items() if k not in ("type", "is_main_result")),
                    key=lambda kv: len(json.dumps(kv[1])))
    for k, v in fields:
        n = len(json.dumps(v))
        if n <= budget:
            out[k] = v
            budget -= n
        else:
            dropped.append(k)
    if dropped:
        note = "[corral: result fields %s dropped: over %d bytes]" % (", ".join(dropped), MAX_RESULT_BYTES)
        out["text"] = (out.get("text") + "\n" + note) if isinstance(out.get("text"), str) else note
    return out


def strip_quotes(s):
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def result_line(data, main):
    line = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif field == "text":
            line["text"] = strip_quotes(value) if isinstance(value, str) else value
        else:
            line[field] = value
    if extra:
        line["extra"] = extra
    return line


def msg_time(msg):
    d = msg.get("header", {}).get("date")
    if isinstance(d, datetime.datetime):
        if d.tzinfo is None:
            d = d.replace(tzinfo=datetime.timezone.utc)
        return d.isoformat()
    if isinstance(d, str) and d:
        return d
    return now_iso()


class Context:
    """A Jupyter kernel and the one thread that drives it.

    All calls into jupyter_client for a kernel happen on its worker thread;
    HTTP threads hand it work through a queue and read a run's lines back."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.km = None
        self.kc = None
        self.cond = threading.Condition()
        self.work = deque()
        self.current = None
        self.closed = False
        self.ready = threading.Event()
        self.start_error = None
        self.thread = threading.Thread(target=self._loop, name="context-" + self.id[:8], daemon=True)
        self.thread.start()

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # --- called from HTTP threads ---

    def submit(self, run):
        with self.cond:
            if self.closed:
                raise HTTPError(404, "Context %s not found" % self.id)
            self.work.append(("run", run, None))
            self.cond.notify()

    def control(self, op, timeout=KERNEL_START_SECONDS + 30):
        """Runs a restart or remove ahead of queued runs, aborting the
        current one; returns once it is done."""
        done = threading.Event()
        box = {}
        with self.cond:
            if self.closed:
                raise HTTPError(404, "Context %s not found" % self.id)
            if self.current is not None:
                self.current.abort(op)
            if op == "remove":
                self.closed = True
                for _, r, _ in self.work:
                    if r is not None:
                        r.abort("remove")
            self.work.appendleft((op, None, (done, box)))
            self.cond.notify()
        if not done.wait(timeout):
            raise HTTPError(500, "context %s: %s did not finish in %d s" % (self.id, op, timeout))
        if box.get("error"):
            raise HTTPError(500, "context %s: %s failed: %s" % (self.id, op, box["error"]))

    # --- the worker thread ---

    def _loop(self):
        try:
            self._start()
        except Exception as e:  # noqa: BLE001 - reported to the creator
            self.start_error = "%s: %s" % (type(e).__name__, e)
            log("context", self.id, "kernel start failed:", self.start_error)
            with self.cond:
                self.closed = True
        self.ready.set()
        while True:
            with self.cond:
                while not self.work:
                    self.cond.wait()
                op, run, ctl = self.work.popleft()
                self.current = run
            try:
                if op == "run":
                    if self.start_error or self.km is None:
                        run.emit({"type": "error", "name": "ExecutionAborted", "value": "the context's kernel did not start: %s" % self.start_error, "traceback": ""})
                        run.finish()
                    else:
                        self._run(run)
                elif op == "restart":
                    self._restart()
                elif op == "remove":
                    self._shutdown()
            except Exception as e:  # noqa: BLE001 - the context must go on
                log("context", self.id, op, "failed:", type(e).__name__, e)
                if ctl is not None:
                    ctl[1]["error"] = "%s: %s" % (type(e).__name__, e)
                if run is not None and not run.done.is_set():
                    run.emit({"type": "error", "name": "UnexpectedEndOfExecution", "value": "%s: %s" % (type(e).__name__, e), "traceback": ""})
                    run.finish()
            finally:
                with self.cond:
                    self.current = None
                if ctl is not None:
                    ctl[0].set()
            if op == "remove":
                with self.cond:
                    rest = list(self.work)
                    self.work.clear()
                for o, r, c in rest:
                    if r is not None:
                        r.emit({"type": "error", "name": "ExecutionAborted", "value": "the context was removed", "traceback": ""})
                        r.finish()
                    if c is not None:
                        c[0].set()
                return

    def _kernel_env(self):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("CORRAL_INTERPRETER_"):
                del env[k]
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env.setdefault("PYTHONUNBUFFERED", "1")
        # ipykernel's debugger otherwise warns on every kernel's stderr.
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        env["JPY_PARENT_PID"] = str(os.getpid())
        return env

    def _start(self):
        from jupyter_client.manager import KernelManager
        self.km = KernelManager(kernel_name=KERNELS[self.language])
        self.km.start_kernel(cwd=self.cwd, env=self._kernel_env())
        self._connect()

    def _connect(self):
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=KERNEL_START_SECONDS)
        self._silent(KERNEL_SETUP)

    def _restart(self):
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:  # noqa: BLE001
                pass
        self.km.restart_kernel(now=True)
        self._connect()

    def _shutdown(self):
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:  # noqa: BLE001
                pass
        if self.km is not None:
            self.km.shutdown_kernel(now=True)

    def _silent(self, code, timeout=30.0):
        """Runs code without output or history; returns False when the
        kernel did not finish within timeout."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self.km.is_alive():
                    return False
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                log("context", self.id, "silent code failed:", msg["content"].get("ename"), msg["content"].get("evalue"))
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                status = self._reply_status(msg_id)
                if status != "ok":
                    log("context", self.id, "silent code ended with status", status)
                return status == "ok"
        return False

    def _reply_status(self, msg_id, timeout=5.0):
        """Reads the shell replies up to msg_id's and returns its status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.kc.get_shell_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return reply.get("content", {}).get("status")
        return None

    def _exit_description(self):
        code = None
        try:
            p = getattr(self.km, "provisioner", None)
            proc = getattr(p, "process", None) if p is not None else getattr(self.km, "kernel", None)
            if proc is not None:
                code = proc.poll()
        except Exception:  # noqa: BLE001
            pass
        if code is None:
            return "the kernel died"
        if code < 0:
            sig = -code
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            if sig == signal.SIGKILL:
                return "the kernel was killed by %s (the out-of-memory killer sends it when the sandbox runs out of memory)" % name
            return "the kernel was killed by %s" % name
        return "the kernel exited with status %d" % code

    def _run(self, run):
        if run.cancel.is_set():
            run.finish()
            return
        if not self.km.is_alive():
            why = self._exit_description()
            self._restart()
            log("context", self.id, "restarted a dead kernel:", why)
        if run.env_vars:
            setter = ("import os as __corral_os\n__corral_saved_env = {k: __corral_os.environ.get(k) for k in %r}\n"
                      "__corral_os.environ.update(%r)\ndel __corral_os" % (list(run.env_vars), run.env_vars))
            if not (self._silent(setter) or self._silent(setter)):
                run.emit({"type": "error", "name": "ExecutionAborted", "value": "the run's env_vars could not be set; the code did not run", "traceback": ""})
                run.finish()
                return
        started = time.monotonic()
        # stop_on_error=False: runs are sent one at a time, so the kernel
        # has nothing queued to abort after an error; with True, a run sent
        # right after an error (or an interrupt) could land in the kernel's
        # abort window and come back "aborted" without having run.
        msg_id = self.kc.execute(run.code, silent=False, store_history=True, allow_stdin=False, stop_on_error=False)
        # The kernel ignores SIGINT except while it executes a request
        # (ipykernel sets SIG_IGN outside its handlers): an interrupt sent
        # before the run's execute_input is lost, and the run would then go
        # on to its end or to a restart. So an interrupt is only sent once
        # the kernel executes the run (executing_at), and the run's timeout
        # counts from then too — not from the request, which waits for the
        # kernel on a busy host.
        executing_at = None
        deadline = None  # set at execute_input
        want_at = None  # when the run was to be interrupted
        interrupted_at = resent_at = None
        reason = None
        error_sent = False
        outcome = "idle"
        while True:
            t = time.monotonic()
            if want_at is None:
                if run.cancel.is_set():
                    reason = run.cancel_reason
                    if reason in ("restart", "remove"):
                        outcome = reason
                        break
                    want_at = t
                elif deadline is not None and t >= deadline:
                    reason = "timeout"
                    want_at = t
                elif executing_at is None and run.timeout and t - started > run.timeout + RUN_START_GRACE_SECONDS:
                    reason = "timeout"
                    outcome = "unstarted"
                    break
            elif run.cancel.is_set() and run.cancel_reason in ("restart", "remove"):
                outcome = run.cancel_reason
                break
            if want_at is not None and interrupted_at is None:
                if executing_at is not None:
                    self.km.interrupt_kernel()
                    interrupted_at = resent_at = t
                elif t - want_at > RUN_START_GRACE_SECONDS:
                    outcome = "unstarted"
                    break
            if interrupted_at is not None:
                if t - interrupted_at > INTERRUPT_GRACE_SECONDS:
                    outcome = "stuck"
                    break
                if t - resent_at >= INTERRUPT_RESEND_SECONDS:
                    self.km.interrupt_kernel()
                    resent_at = t
            try:
                msg = self.kc.get_iopub_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self.km.is_alive():
                    outcome = "died"
                    break
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "status":
                if content.get("execution_state") == "idle":
                    break
            elif kind == "stream":
                text = content.get("text", "")
                name = "stderr" if content.get("name") == "stderr" else "stdout"
                ts = msg_time(msg)
                for i in range(0, max(len(text), 1), MAX_STREAM_TEXT):
                    run.emit({"type": name, "text": text[i:i + MAX_STREAM_TEXT], "timestamp": ts})
            elif kind == "execute_input":
                if executing_at is None:
                    executing_at = time.monotonic()
                    deadline = executing_at + run.timeout if run.timeout else None
                if content.get("execution_count") is not None:
                    run.emit({"type": "number_of_executions", "execution_count": content["execution_count"]})
            elif kind in ("execute_result", "display_data", "update_display_data"):
                run.emit(result_line(content.get("data", {}), kind == "execute_result"))
            elif kind == "error":
                if want_at is None and not error_sent:
                    error_sent = True
                    run.emit({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                              "traceback": "\n".join(content.get("traceback", []))})
        took = time.monotonic() - started
        if outcome == "idle" and self._reply_status(msg_id) == "aborted" and not error_sent:
            # The kernel refused the request without running it: never a
            # silent success with no result.
            run.emit({"type": "error", "name": "ExecutionAborted",
                      "value": "the kernel aborted the run before it started; the code did not run", "traceback": ""})
            error_sent = True
        if outcome in ("died", "stuck", "unstarted"):
            why = self._exit_description() if outcome == "died" else None
            self._restart()
            if outcome == "died":
                run.emit({"type": "error", "name": "UnexpectedEndOfExecution",
                          "value": why + "; the context was restarted and its state is lost", "traceback": ""})
                error_sent = True
        if reason == "timeout":
            if outcome == "stuck":
                value = ("execution timed out after %.3g s; the kernel was interrupted but did not stop within %.3g s, "
                         "so the context was restarted and its state is lost" % (run.timeout, INTERRUPT_GRACE_SECONDS))
            elif outcome == "unstarted":
                value = ("execution timed out: the kernel had not started the run %.3g s after it was sent, "
                         "so the context was restarted and its state is lost" % (run.timeout + RUN_START_GRACE_SECONDS))
            else:
                value = "execution timed out after %.3g s; the kernel was interrupted and the context keeps its state" % run.timeout
            run.emit({"type": "error", "name": "TimeoutError", "value": value, "traceback": ""})
        elif outcome == "restart":
            run.emit({"type": "error", "name": "ContextRestarting", "value": "the context was restarted during the run", "traceback": ""})
        elif outcome == "remove":
            run.emit({"type": "error", "name": "ExecutionAborted", "value": "the context was removed during the run", "traceback": ""})
        elif outcome == "stuck" and reason == "disconnect":
            log("context", self.id, "the client left and the run did not stop on interrupt; restarted the kernel")
        elif outcome == "unstarted" and reason == "disconnect":
            log("context", self.id, "the client left and the kernel did not start the run; restarted the kernel")
        if run.env_vars and outcome in ("idle",) and self.km.is_alive():
            self._silent("import os as __corral_os\nfor __k, __v in __corral_saved_env.items():\n"
                         "    __corral_os.environ.pop(__k, None) if __v is None else __corral_os.environ.__setitem__(__k, __v)\n"
                         "del __corral_os, __corral_saved_env, __k, __v")
        if run.truncated:
            log("context", self.id, "run output truncated after", run.sent, "bytes")
        run.took = took
        run.finish()


class Contexts:
    """The server's contexts and the default context per language."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}

    def create(self, language, cwd, default=False):
        with self.lock:
            if len(self.by_id) >= MAX_CONTEXTS:
                raise HTTPError(429, "too many contexts (at most %d): remove one first" % MAX_CONTEXTS)
            ctx = Context(language, cwd)
            self.by_id[ctx.id] = ctx
            if default:
                self.defaults[language] = ctx
        ctx.ready.wait(KERNEL_START_SECONDS + 10)
        if ctx.start_error:
            self.forget(ctx)
            raise HTTPError(500, "context kernel did not start: %s" % ctx.start_error)
        return ctx

    def forget(self, ctx):
        with self.lock:
            self.by_id.pop(ctx.id, None)
            for lang, d in list(self.defaults.items()):
                if d is ctx:
                    del self.defaults[lang]

    def get(self, cid):
        with self.lock:
            ctx = self.by_id.get(cid)
        if ctx is None:
            raise HTTPError(404, "Context %s not found" % cid)
        return ctx

    def default(self, language):
        """The default context of language, created once on first use."""
        with DEFAULT_LOCK:
            with self.lock:
                ctx = self.defaults.get(language)
            if ctx is not None and not ctx.closed:
                return ctx
            return self.create(language, DEFAULT_CWD, default=True)

    def list(self):
        with self.lock:
            return [c.view() for c in self.by_id.values()]


DEFAULT_LOCK = threading.Lock()
CONTEXTS = Contexts()


def client_gone(sock):
    """True when the client closed its side of the connection."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        if not r:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "corral-interpreter"

    def log_message(self, fmt, *args):
        pass

    def _send(self, status, body, ctype="text/plain; charset=utf-8"):
        if not isinstance(body, bytes):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            # An unread body is left on the connection: the client must
            # not send its next request on it.
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status, obj):
        self._send(status, json.dumps(obj), "application/json")

    def _body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline(64).strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                if len(data) + size > MAX_BODY_BYTES:
                    self.close_connection = True
                    raise HTTPError(413, "request body over %d bytes" % MAX_BODY_BYTES)
                data += self.rfile.read(size)
                self.rfile.readline(8)
        else:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise HTTPError(400, "bad Content-Length")
            if n > MAX_BODY_BYTES:
                self.close_connection = True
                raise HTTPError(413, "request body over %d bytes" % MAX_BODY_BYTES)
            data = self.rfile.read(n) if n > 0 else b""
        if not data.strip():
            return {}
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise HTTPError(400, "request body is not JSON: %s" % e)
        if not isinstance(obj, dict):
            raise HTTPError(400, "request body must be a JSON object")
        return obj

    def _route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        try:
            if method == "GET" and path == "/health":
                return self._json(200, "OK")
            if method == "POST" and path == "/execute":
                return self._execute()
            if path == "/contexts":
                if method == "POST":
                    return self._create_context()
                if method == "GET":
                    return self._json(200, CONTEXTS.list())
            if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart" and method == "POST":
                ctx = CONTEXTS.get(parts[1])
                ctx.control("restart")
                return self._json(200, ctx.view())
            if len(parts) == 2 and parts[0] == "contexts" and method == "DELETE":
                ctx = CONTEXTS.get(parts[1])
                ctx.control("remove")
                CONTEXTS.forget(ctx)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            raise HTTPError(404, "no such route: %s %s" % (method, path))
        except HTTPError as e:
            self._send(e.status, e.message)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_DELETE(self):
        self._route("DELETE")

    def _create_context(self):
        body = self._body()
        language = normalize_language(body.get("language"))
        cwd = body.get("cwd") or DEFAULT_CWD
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise HTTPError(400, "cwd must be an absolute path")
        if not os.path.isdir(cwd):
            raise HTTPError(400, "cwd %s is not a directory" % cwd)
        ctx = CONTEXTS.create(language, cwd)
        self._json(200, ctx.view())

    def _execute(self):
        body = self._body()
        code = body.get("code")
        if not isinstance(code, str):
            raise HTTPError(400, "code must be a string")
        cid = body.get("context_id")
        lang = body.get("language")
        if cid and lang:
            raise HTTPError(400, "You can provide context_id or language, but not both at the same time.")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or len(env_vars) > MAX_ENV_VARS or \
                not all(isinstance(k, str) and k and "=" not in k and "\0" not in k and isinstance(v, str) and "\0" not in v
                        for k, v in env_vars.items()):
            raise HTTPError(400, "env_vars must be an object of at most %d string values with names without '=' or NUL" % MAX_ENV_VARS)
        timeout = body.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
                raise HTTPError(400, "timeout must be a non-negative number of seconds (0: none)")
            timeout = float(timeout) or None
        if cid:
            if not isinstance(cid, str):
                raise HTTPError(400, "context_id must be a string")
            ctx = CONTEXTS.get(cid)
        else:
            ctx = CONTEXTS.default(normalize_language(lang))
        run = Run(code, env_vars, timeout)
        ctx.submit(run)
        self._stream(run)

    def _stream(self, run):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        sock = self.connection

        def write(obj):
            data = (json.dumps(obj) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        last = time.monotonic()
        try:
            write_ok = True
            while True:
                try:
                    line = run.lines.get(timeout=POLL_SECONDS * 2)
                except queue.Empty:
                    line = False
                if line is None:
                    break
                if line is False:
                    if client_gone(sock):
                        raise BrokenPipeError("client closed the connection")
                    if time.monotonic() - last >= KEEPALIVE_SECONDS:
                        write({"type": "keepalive"})
                        last = time.monotonic()
                    continue
                write(line)
                last = time.monotonic()
            write({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (OSError, ValueError):
            write_ok = False
        if not write_ok:
            # The client has gone: interrupt the run so that the kernel is
            # free for the next caller.
            run.abort("disconnect")
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def main():
    srv = Server((HOST, PORT), Handler)
    log("listening on %s:%d" % srv.server_address[:2])

    def default():
        try:
            CONTEXTS.default("python")
        except Exception as e:  # noqa: BLE001
            log("default python context:", getattr(e, "message", e))
    threading.Thread(target=default, name="default-context", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        for c in list(CONTEXTS.by_id.values()):
            try:
                c.km.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001
                pass


if __name__ == "__main__":
    main()
