"""Unit tests of the SDK that need no corral server: error mapping, the
Connect envelope, result parsing (a canned code-run answer), and the
request wire, checked against a local fake of the server's routes (a
seam test beside the live suite, test_live.py)."""

import base64
import http.server
import json
import os
import shutil
import ssl
import struct
import subprocess
import tempfile
import threading
import unittest
from unittest import mock

import corral
from corral import _http, tools
from corral.errors import error_for, error_from_response
from corral.models import EntryInfo, Execution, Result
from corral.sandbox import CommandResult, apply_end, decode_tail, execution_from_lines


def env(**kw):
    """A patched environment with only the CORRAL_* variables given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    clean.update(kw)
    return mock.patch.dict(os.environ, clean, clear=True)


class ErrorMappingTest(unittest.TestCase):
    def test_codes_map_to_classes(self):
        """Each stable code of docs/api.md becomes its class, keeping the
        server's message, code and status."""
        cases = [
            (401, "unauthenticated", corral.AuthenticationError),
            (403, "forbidden", corral.ForbiddenError),
            (404, "not_found", corral.NotFoundError),
            (409, "conflict", corral.ConflictError),
            (400, "invalid_argument", corral.InvalidArgument),
            (400, "invalid_json", corral.InvalidArgument),
            (429, "capacity_exceeded", corral.CapacityExceeded),
            (429, "too_many_streams", corral.TooManyStreams),
            (403, "budget_exhausted", corral.BudgetExhausted),
            (403, "loop_detected", corral.LoopDetected),
            (403, "task_ended", corral.TaskEnded),
            (503, "unavailable", corral.UnavailableError),
            (500, "internal", corral.APIError),
        ]
        for status, code, cls in cases:
            with self.subTest(code=code):
                body = json.dumps({"code": code, "message": "the server's words"}).encode()
                e = error_from_response(status, {}, body)
                self.assertIs(type(e), cls)
                self.assertEqual((e.code, e.status, e.message), (code, status, "the server's words"))

    def test_brakes_are_brake_errors(self):
        for code in ("budget_exhausted", "loop_detected", "task_ended"):
            self.assertIsInstance(error_for(code, "m", 403), corral.BrakeError)
        self.assertNotIsInstance(error_for("capacity_exceeded", "m", 429), corral.BrakeError)

    def test_retry_after(self):
        e = error_from_response(429, {"Retry-After": "3"}, b'{"code":"capacity_exceeded","message":"full"}')
        self.assertIsInstance(e, corral.CapacityExceeded)
        self.assertEqual(e.retry_after, 3)
        self.assertIn("retry after 3 s", str(e))

    def test_connect_brake_refusal(self):
        """The agent API reports a brake as resource_exhausted with the
        brake's code first in the message: it must be the brake's class."""
        msg = "budget_exhausted: the task's max_calls budget is spent. Stop making tool calls: summarise"
        e = error_for("resource_exhausted", msg)
        self.assertIsInstance(e, corral.BudgetExhausted)
        self.assertEqual((e.code, e.status, e.message), ("budget_exhausted", 403, msg))
        self.assertEqual(str(e), msg)  # the message already names the code
        self.assertIs(type(error_for("resource_exhausted", "other")), corral.APIError)

    def test_files_shape_and_plain_bodies(self):
        e = error_from_response(404, {}, b'{"code": 404, "message": "file not found"}')
        self.assertIsInstance(e, corral.NotFoundError)
        self.assertEqual(e.message, "file not found")
        e = error_from_response(502, {}, b"Bad Gateway\n")
        self.assertIsInstance(e, corral.UnavailableError)
        self.assertEqual(e.message, "Bad Gateway")

    def test_command_errors_carry_the_result(self):
        r = CommandResult(exit_code=124, stdout="o", stderr="e", timed_out=True)
        e = corral.CommandTimeout(r)
        self.assertIsInstance(e, corral.CommandExitError)
        self.assertEqual((e.exit_code, e.stdout, e.stderr), (124, "o", "e"))


def frames(*msgs, end=None):
    out = b""
    for m in msgs:
        out += _http.envelope(m)
    out += _http.envelope(end or {}, flags=0x02)
    return out


def reader(data):
    pos = [0]

    def read(n):
        chunk = data[pos[0]:pos[0] + n]
        pos[0] += n
        if len(chunk) < n:
            raise _http.StreamBroken("short")
        return chunk
    return read


class EnvelopeTest(unittest.TestCase):
    def test_round_trip(self):
        msgs = [{"event": {"start": {"pid": 7}}}, {"event": {"data": {"stdout": "aGk="}}}]
        self.assertEqual(list(_http.read_envelopes(reader(frames(*msgs)))), msgs)
        head = _http.envelope({"a": 1})[:5]
        self.assertEqual(struct.unpack(">BI", head), (0, len(b'{"a": 1}')))

    def test_end_stream_error_is_raised_typed(self):
        data = frames({"event": {"keepalive": {}}},
                      end={"error": {"code": "resource_exhausted", "message": "loop_detected: stop"}})
        it = _http.read_envelopes(reader(data))
        self.assertEqual(next(it), {"event": {"keepalive": {}}})
        with self.assertRaises(corral.LoopDetected):
            next(it)

    def test_cut_stream(self):
        data = frames({"x": 1})[:-3]
        with self.assertRaises(_http.StreamBroken):
            list(_http.read_envelopes(reader(data)))

    def test_refuses_compressed_and_oversized(self):
        with self.assertRaises(_http.StreamBroken):
            list(_http.read_envelopes(reader(_http.envelope({"x": 1}, flags=0x01))))
        with self.assertRaises(_http.StreamBroken):
            list(_http.read_envelopes(reader(struct.pack(">BI", 0, _http.MAX_MESSAGE + 1))))


class EndEventTest(unittest.TestCase):
    def test_exit_codes(self):
        cases = [
            ({"exitCode": 3, "exited": True, "status": "exit status 3"}, 3, False, ""),
            ({"exited": True, "status": "exit status 0"}, 0, False, ""),
            ({"exitCode": -1, "status": "signal: killed", "timedOut": True}, 124, True, "timeout"),
            ({"exitCode": -1, "status": "signal: killed"}, 137, False, ""),
            ({"status": "signal: segmentation fault (core dumped)"}, 139, False, ""),
            ({"status": "signal: signal 34"}, 162, False, ""),
            ({"exitCode": -1, "status": "", "endReason": "oom"}, 137, False, "oom"),
        ]
        for end, code, timed_out, reason in cases:
            with self.subTest(end=end):
                r = CommandResult()
                apply_end(r, end)
                self.assertEqual((r.exit_code, r.timed_out, r.end_reason), (code, timed_out, reason))

    def test_decode_tail_skips_a_cut_character(self):
        b = "é".encode() * 3
        self.assertEqual(decode_tail(b[1:], True), "éé")
        self.assertEqual(decode_tail(b, False), "ééé")


# A canned answer of POST /v1/sandboxes/{id}/code (docs/api.md, Code runs).
CANNED_RUN = {
    "results": [
        {"type": "result", "is_main_result": False, "png": base64.b64encode(b"\x89PNG\r\n").decode(),
         "text": "<Figure size 640x480 with 1 Axes>"},
        {"type": "result", "is_main_result": True, "text": "42", "html": "<b>42</b>",
         "data": {"a": [1, 2]}, "json": {"k": "v"}},
    ],
    "logs": {"stdout": ["hello\n"], "stderr": ["warn\n"]},
    "error": {"name": "ZeroDivisionError", "value": "division by zero",
              "traceback": "Traceback (most recent call last):\n  ZeroDivisionError"},
    "execution_count": 3, "truncated": False, "timed_out": False, "oom": False, "duration_ms": 17,
}


class CodeRunParsingTest(unittest.TestCase):
    def test_native_answer(self):
        ex = Execution.from_wire(CANNED_RUN)
        self.assertEqual(ex.results[0].png, b"\x89PNG\r\n")
        self.assertEqual(ex.results[0].formats(), ["text", "png"])
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.results[1].html, "<b>42</b>")
        self.assertEqual(ex.results[1].data, {"a": [1, 2]})
        self.assertEqual(ex.results[1].json, {"k": "v"})
        self.assertEqual((ex.logs.stdout, ex.logs.stderr), (["hello\n"], ["warn\n"]))
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("Traceback", ex.error.traceback)
        self.assertEqual((ex.execution_count, ex.duration_ms), (3, 17))

    def test_stream_lines(self):
        lines = [json.dumps(x).encode() + b"\n" for x in [
            {"type": "number_of_executions", "execution_count": 2},
            {"type": "stdout", "text": "a\n"},
            {"type": "stderr", "text": "[corral: output truncated at 1048576 bytes]\n"},
            {"type": "result", "is_main_result": True, "text": "1", "png": "aGk="},
            {"type": "error", "name": "TimeoutError", "value": "run timed out", "traceback": ""},
            {"type": "end_of_execution"},
        ]] + [b"not json\n", b"\n"]
        seen = []
        ex = execution_from_lines(lines, on_stdout=seen.append, on_result=lambda r: seen.append(r.text),
                                  on_error=lambda e: seen.append(e.name))
        self.assertEqual(seen, ["a\n", "1", "TimeoutError"])
        self.assertEqual(ex.results[0].png, b"hi")
        self.assertTrue(ex.timed_out)
        self.assertTrue(ex.truncated)
        self.assertEqual(ex.execution_count, 2)

    def test_entry_info(self):
        e = EntryInfo.from_wire({"name": "a", "type": "FILE_TYPE_DIRECTORY", "path": "/a", "size": "4096",
                                 "mode": 493, "owner": "user", "modifiedTime": "2026-12-01T10:00:00.123456789Z"})
        self.assertEqual((e.type, e.size, e.mode), ("dir", 4096, 493))
        self.assertEqual(e.modified_time.microsecond, 123456)


class ConfigTest(unittest.TestCase):
    def test_env(self):
        with env(CORRAL_URL="http://127.0.0.1:9/", CORRAL_API_KEY="k1"):
            c = corral.Client()
            self.assertEqual((c.url, c._t.api_key), ("http://127.0.0.1:9", "k1"))

    def test_arguments_win(self):
        with env(CORRAL_URL="http://127.0.0.1:9", CORRAL_API_KEY="k1"):
            c = corral.Client("http://localhost:10", "k2")
            self.assertEqual((c.url, c._t.api_key), ("http://localhost:10", "k2"))

    def test_local_admin_key(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "admin.key"), "w") as f:
                f.write("e2b_local\n")
            with env(CORRAL_DATA=d):
                self.assertEqual(corral.Client()._t.api_key, "e2b_local")

    def test_remote_without_key_fails(self):
        with env(CORRAL_URL="https://corral.example:7420"):
            with self.assertRaisesRegex(corral.CorralError, "CORRAL_API_KEY"):
                corral.Client()

    def test_bad_url(self):
        with self.assertRaises(corral.CorralError):
            corral.Client("ftp://x", "k")

    def test_ca_file(self):
        with env(CORRAL_CA_FILE="/nonexistent/ca.pem"):
            with self.assertRaises(OSError):
                corral.Client("https://localhost:1", "k")


class Fake(http.server.BaseHTTPRequestHandler):
    """A local fake of the server's routes that records each request."""

    protocol_version = "HTTP/1.1"
    requests = []

    def log_message(self, *a):
        pass

    def _send(self, status, body, ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        Fake.requests.append(("GET", self.path, dict(self.headers), b""))
        if self.path.startswith("/v1/sandboxes/sb1/agent/files"):
            self._send(200, b"file-bytes", "application/octet-stream")
        elif self.path == "/v1/sandboxes/sb1":
            self._send(200, json.dumps({"id": "sb1", "state": "running"}).encode())
        else:
            self._send(404, b'{"code":"not_found","message":"sandbox not found"}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        Fake.requests.append(("POST", self.path, dict(self.headers), body))
        if self.path == "/v1/sandboxes":
            self._send(201, json.dumps({"id": "sb1", "state": "running", "task": "t1"}).encode())
        elif self.path == "/v1/sandboxes/sb1/agent/process.Process/Start":
            out = frames({"event": {"keepalive": {}}}, {"event": {"start": {"pid": 42}}},
                         {"event": {"data": {"stdout": base64.b64encode(b"hi\n").decode()}}},
                         {"event": {"data": {"stderr": base64.b64encode(b"oops\n").decode()}}},
                         {"event": {"end": {"exitCode": 2, "exited": True, "status": "exit status 2"}}})
            self._send(200, out, "application/connect+json")
        elif self.path == "/v1/sandboxes/sb1/code":
            self._send(200, json.dumps(CANNED_RUN).encode())
        elif self.path == "/v1/sandboxes/sb2":
            self._send(429, b'{"code":"capacity_exceeded","message":"full"}', headers=[("Retry-After", "2")])
        else:
            self._send(200, b"{}")


class WireTest(unittest.TestCase):
    """The requests the SDK sends, as the server reads them."""

    @classmethod
    def setUpClass(cls):
        cls.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
        threading.Thread(target=cls.srv.serve_forever, daemon=True).start()
        cls.url = f"http://127.0.0.1:{cls.srv.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.srv.shutdown()
        cls.srv.server_close()

    def setUp(self):
        Fake.requests.clear()
        self.client = corral.Client(self.url, "e2b_key")

    def test_create_body(self):
        corral.Sandbox(client=self.client, template="base", cpus=1, memory_mb=512, disk_mb=100, timeout=59.5,
                       envs={"A": "1"}, metadata={"m": "v"}, allow=["pypi.org"], secrets=["gh"], task="t1")
        method, path, headers, body = Fake.requests[0]
        self.assertEqual((method, path, headers["X-API-Key"]), ("POST", "/v1/sandboxes", "e2b_key"))
        self.assertEqual(json.loads(body), {
            "template": "base", "resources": {"cpu": 1, "memory_mb": 512, "disk_mb": 100}, "timeout": 60,
            "env": {"A": "1"}, "metadata": {"m": "v"}, "network": "allow", "allow": ["pypi.org"],
            "secrets": ["gh"], "task": "t1"})

    def test_command_start_wire(self):
        """Start is a Connect server-streaming call with the JSON codec:
        enveloped body, the timeout as Connect-Timeout-Ms, the user as
        Basic auth; the events become the result."""
        sb = corral.Sandbox(client=self.client)
        out = []
        with self.assertRaises(corral.CommandExitError) as cm:
            sb.commands.run("echo hi", timeout=2.5, user="root", cwd="/tmp", envs={"K": "V"},
                            on_stdout=out.append)
        r = cm.exception.result
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.pid), (2, "hi\n", "oops\n", 42))
        self.assertEqual(out, ["hi\n"])
        _, path, h, body = Fake.requests[1]
        self.assertEqual(path, "/v1/sandboxes/sb1/agent/process.Process/Start")
        self.assertEqual(h["Content-Type"], "application/connect+json")
        self.assertEqual(h["Connect-Protocol-Version"], "1")
        self.assertEqual(h["Connect-Timeout-Ms"], "2500")
        self.assertEqual(h["Authorization"], "Basic " + base64.b64encode(b"root:").decode())
        self.assertEqual(h["X-API-Key"], "e2b_key")
        flags, n = struct.unpack(">BI", body[:5])
        self.assertEqual((flags, n), (0, len(body) - 5))
        self.assertEqual(json.loads(body[5:]), {"process": {
            "cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"K": "V"}, "cwd": "/tmp"},
            "stdin": False})

    def test_background_callback_error_kills_and_is_raised(self):
        """A callback that raises on a background command's reader thread
        kills the command (SendSignal SIGKILL) and wait() raises it."""
        sb = corral.Sandbox(client=self.client)

        def boom(s):
            raise RuntimeError("callback failed")
        h = sb.commands.run("echo hi", background=True, on_stdout=boom)
        with self.assertRaisesRegex(RuntimeError, "callback failed"):
            h.wait(timeout=30)
        kills = [json.loads(r[3]) for r in Fake.requests if r[1].endswith("/process.Process/SendSignal")]
        self.assertEqual(kills, [{"process": {"pid": 42}, "signal": "SIGNAL_SIGKILL"}])

    def test_unary_wire(self):
        sb = corral.Sandbox(client=self.client)
        sb.commands.send_stdin(7, b"\x00data")
        _, path, h, body = Fake.requests[1]
        self.assertEqual(path, "/v1/sandboxes/sb1/agent/process.Process/SendInput")
        self.assertEqual(h["Content-Type"], "application/json")
        self.assertEqual(json.loads(body), {"process": {"pid": 7},
                                            "input": {"stdin": base64.b64encode(b"\x00data").decode()}})

    def test_files_wire(self):
        sb = corral.Sandbox(client=self.client)
        self.assertEqual(sb.files.read("/a b", format="bytes", user="root"), b"file-bytes")
        self.assertEqual(Fake.requests[1][1], "/v1/sandboxes/sb1/agent/files?path=%2Fa+b&username=root")
        sb.files.write("/x", "é")
        _, path, h, body = Fake.requests[2]
        self.assertEqual((path, h["Content-Type"], body), ("/v1/sandboxes/sb1/agent/files?path=%2Fx",
                                                           "application/octet-stream", "é".encode()))

    def test_run_code_canned(self):
        sb = corral.Sandbox(client=self.client)
        ex = sb.run_code("x", timeout=5, context="ctx1", envs={"E": "1"})
        self.assertEqual(json.loads(Fake.requests[1][3]),
                         {"code": "x", "context_id": "ctx1", "env_vars": {"E": "1"}, "timeout": 5.0})
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.results[0].png, b"\x89PNG\r\n")
        self.assertEqual(ex.error.name, "ZeroDivisionError")

    def test_error_answer(self):
        with self.assertRaises(corral.CapacityExceeded) as cm:
            self.client._t.call("POST", "/v1/sandboxes/sb2", {})
        self.assertEqual(cm.exception.retry_after, 2)


def make_tls(d):
    """A CA and a certificate for 127.0.0.1 it signed, made with openssl
    (which ca-certificates brings along)."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=corral test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
        "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf")
    return os.path.join(d, "ca.pem"), os.path.join(d, "srv.pem"), os.path.join(d, "srv.key")


class TLSTest(unittest.TestCase):
    """CORRAL_CA_FILE: an https:// server with a private CA is trusted
    with the CA file, and refused without it (no silent fallback to an
    unverified connection)."""

    @classmethod
    def setUpClass(cls):
        if not shutil.which("openssl"):
            raise unittest.SkipTest("openssl is not installed")
        cls.dir = tempfile.mkdtemp()
        cls.ca, cert, key = make_tls(cls.dir)
        cls.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        cls.srv.socket = ctx.wrap_socket(cls.srv.socket, server_side=True)
        threading.Thread(target=cls.srv.serve_forever, daemon=True).start()
        cls.url = f"https://127.0.0.1:{cls.srv.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.srv.shutdown()
        cls.srv.server_close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_ca_file_from_env(self):
        with env(CORRAL_CA_FILE=self.ca, CORRAL_API_KEY="k"):
            c = corral.Client(self.url)
            self.assertEqual(c.get_sandbox("sb1")["state"], "running")

    def test_ca_file_argument(self):
        c = corral.Client(self.url, "k", ca_file=self.ca)
        self.assertEqual(c.get_sandbox("sb1")["state"], "running")

    def test_untrusted_without_ca_file(self):
        with env(CORRAL_API_KEY="k"):
            c = corral.Client(self.url)
            with self.assertRaisesRegex(corral.CorralError, "CERTIFICATE_VERIFY_FAILED"):
                c.get_sandbox("sb1")


class ToolsTest(unittest.TestCase):
    def test_schema(self):
        s = tools.EXECUTE_CODE_SCHEMA
        self.assertEqual(s["required"], ["code"])
        self.assertEqual(tools.openai_tool()["function"]["parameters"], s)
        self.assertEqual(tools.anthropic_tool()["input_schema"], s)
        json.dumps(tools.openai_tool())

    def test_text_tail(self):
        t = tools._TextTail(5)
        for s in ["ab", "cdef", "gh"]:
            t.write(s)
        self.assertEqual((t.text(), t.truncated), ("defgh", True))
        t = tools._TextTail(10)
        t.write("abc")
        self.assertEqual((t.text(), t.truncated), ("abc", False))

    def test_call_tool_refuses_bad_arguments(self):
        for name, args in [("rm_rf", {"code": "x"}), ("execute_code", {}),
                           ("execute_code", {"code": "x", "timeout": 0}),
                           ("execute_code", {"code": "x", "timeout": 10 ** 6}),
                           ("execute_code", {"code": "x", "shell": True}),
                           ("execute_code", {"code": "x", "language": "cobol"})]:
            with self.subTest(name=name, args=args):
                with self.assertRaises(ValueError):
                    tools.call_tool(name, args)


if __name__ == "__main__":
    unittest.main()
