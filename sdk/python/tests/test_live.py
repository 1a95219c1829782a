"""The SDK against a live corral server (run by test/integration's
TestPythonSDK, which sets CORRAL_URL and CORRAL_API_KEY to its server's).

Every test asserts what the server did (the file is in the sandbox, the
sandbox ended, the call was refused with this code), not only that a
call returned. Without CORRAL_URL the tests are skipped, saying why.
"""

import io
import os
import secrets
import threading
import time
import unittest

import corral
from corral import tools

LIVE = bool(os.environ.get("CORRAL_URL") and os.environ.get("CORRAL_API_KEY"))
SKIP = "no live server: set CORRAL_URL and CORRAL_API_KEY (test/integration's TestPythonSDK does)"


def wait_for(what, cond, limit=60.0):
    """Polls cond until it holds or the (generous) limit passes."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {limit} s")
        time.sleep(0.1)


@unittest.skipUnless(LIVE, SKIP)
class LiveTest(unittest.TestCase):
    def setUp(self):
        self.client = corral.Client()
        self.agent = "pysdk-" + secrets.token_hex(4)

    def sandbox(self, **kw):
        """A sandbox killed at the end of the test."""
        kw.setdefault("timeout", 300)
        sb = corral.Sandbox(client=self.client, **kw)
        self.addCleanup(self._kill, sb.id)
        return sb

    def _kill(self, sid):
        try:
            self.client.kill_sandbox(sid)
        except corral.SandboxNotFound:
            pass

    def state(self, sid):
        return self.client.get_sandbox(sid)["state"]


class SandboxTest(LiveTest):
    def test_create_options_reach_the_sandbox(self):
        """Every create option the issue names arrives: resources, TTL,
        env vars, metadata; list filters by the metadata."""
        sb = self.sandbox(template="base", cpus=0.5, memory_mb=256, disk_mb=200, timeout=120,
                          envs={"PYSDK_VAR": "from-python"}, metadata={"suite": self.agent})
        info = sb.refresh()
        self.assertEqual(info["state"], "running")
        self.assertEqual(info["resources"]["cpu"], 0.5)
        self.assertEqual(info["resources"]["memory_mb"], 256)
        self.assertEqual(info["resources"]["disk_mb"], 200)
        self.assertEqual(sb.metadata, {"suite": self.agent})
        self.assertTrue(sb.task_id)
        r = sb.commands.run("echo $PYSDK_VAR; cat /sys/fs/cgroup/memory.max 2>/dev/null || true")
        self.assertEqual(r.stdout.splitlines()[0], "from-python")
        listed = corral.Sandbox.list(metadata={"suite": self.agent}, client=self.client)
        self.assertEqual([s["id"] for s in listed], [sb.id])

        before = sb.expires_at
        sb.set_timeout(900)
        self.assertGreater(sb.expires_at, before)

        ended = sb.kill()
        self.assertEqual(ended["state"], "ended")
        self.assertEqual(ended["end_reason"], "killed")
        self.assertEqual(self.state(sb.id), "ended")
        with self.assertRaises(corral.SandboxNotFound):
            sb.kill()
        # A command in the ended sandbox is refused: not_found, or
        # task_ended when its own (implicit) task ended with it.
        with self.assertRaises((corral.SandboxNotFound, corral.TaskEnded)):
            sb.commands.run("true")

    def test_context_manager_kills_on_exception(self):
        """`with Sandbox() as sb:` kills the sandbox when the block raises,
        and the block's exception is what propagates."""
        holder = {}
        with self.assertRaises(ZeroDivisionError):
            with corral.Sandbox(client=self.client, timeout=120) as sb:
                holder["id"] = sb.id
                self.assertEqual(self.state(sb.id), "running")
                1 / 0
        self.assertEqual(self.state(holder["id"]), "ended")
        self.assertEqual(self.client.get_sandbox(holder["id"])["end_reason"], "killed")

    def test_context_manager_kills_on_exit(self):
        with corral.Sandbox(client=self.client, timeout=120) as sb:
            sid = sb.id
        self.assertEqual(self.state(sid), "ended")

    def test_connect(self):
        sb = self.sandbox()
        other = corral.Sandbox.connect(sb.id, client=self.client)
        self.assertEqual(other.commands.run("echo hi").stdout, "hi\n")
        with self.assertRaises(corral.SandboxNotFound):
            corral.Sandbox.connect("nosuchsandbox0000000", client=self.client)

    def test_pause_resume(self):
        """A paused sandbox refuses commands with ConflictError and keeps
        its processes' memory; resume makes it usable again."""
        sb = self.sandbox()
        sb.files.write("/tmp/kept", "before pause")
        self.assertEqual(sb.pause()["state"], "paused")
        self.assertEqual(self.state(sb.id), "paused")
        with self.assertRaises(corral.ConflictError):
            sb.commands.run("true")
        self.assertEqual(sb.resume(timeout=200)["state"], "running")
        self.assertEqual(sb.files.read("/tmp/kept"), "before pause")

    def test_snapshot_and_sandbox_from_it(self):
        """Sandbox(snapshot=ID) starts with the files of the snapshot."""
        sb = self.sandbox()
        sb.files.write("/home/user/state.txt", "snapshotted")
        snap = sb.snapshot(name="pysdk")
        self.assertTrue(snap["id"].startswith("snap-"))
        self.addCleanup(self.client.delete_snapshot, snap["id"])
        self.assertEqual(snap["sandbox"], sb.id)
        self.assertIn(snap["id"], [s["id"] for s in self.client.list_snapshots(sandbox=sb.id)])
        copy = self.sandbox(snapshot=snap["id"])
        self.assertEqual(copy.files.read("/home/user/state.txt"), "snapshotted")

    def test_save_template(self):
        """save_template makes a template a new sandbox starts from."""
        sb = self.sandbox()
        sb.files.write("/home/user/tpl.txt", "templated")
        name = "pysdk-" + secrets.token_hex(3)
        tpl = sb.save_template(name, "v1")
        self.assertEqual(tpl["ref"], name + ":v1")
        self.assertIn(name + ":v1", [t["ref"] for t in self.client.list_templates(name=name)])
        child = self.sandbox(template=name + ":v1")
        self.assertEqual(child.files.read("/home/user/tpl.txt"), "templated")
        child.kill()
        for t in self.client.list_templates(name=name):
            try:
                self.client.delete_template(t["ref"])
            except corral.ConflictError:
                pass


class CommandsTest(LiveTest):
    def setUp(self):
        super().setUp()
        self.sb = self.sandbox(task=corral.Task(client=self.client, no_loop_check=True, max_calls=1000))

    def test_run_result(self):
        r = self.sb.commands.run("echo out; echo err >&2")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, "out\n", "err\n"))
        self.assertEqual((r.stdout_bytes, r.stderr_bytes, r.truncated, r.timed_out), (4, 4, False, False))
        self.assertGreater(r.pid, 0)
        self.assertGreaterEqual(r.duration_ms, 0)

    def test_cwd_envs_user(self):
        r = self.sb.commands.run("pwd; echo $A$B; id -u", cwd="/tmp", envs={"A": "1", "B": "2"})
        self.assertEqual(r.stdout, "/tmp\n12\n1000\n")
        self.assertEqual(self.sb.commands.run("id -u", user="root").stdout, "0\n")

    def test_args_without_shell(self):
        r = self.sb.commands.run("/bin/echo", args=["a b", "$HOME"])
        self.assertEqual(r.stdout, "a b $HOME\n")

    def test_exit_error(self):
        """A non-zero exit raises CommandExitError with the output; with
        check=False the result comes back."""
        with self.assertRaises(corral.CommandExitError) as cm:
            self.sb.commands.run("echo partial; echo bad >&2; exit 3")
        self.assertNotIsInstance(cm.exception, corral.CommandTimeout)
        self.assertEqual(cm.exception.exit_code, 3)
        self.assertEqual(cm.exception.stdout, "partial\n")
        self.assertEqual(cm.exception.stderr, "bad\n")
        r = self.sb.commands.run("exit 5", check=False)
        self.assertEqual(r.exit_code, 5)

    def test_timeout(self):
        """A command past its timeout is killed: CommandTimeout with exit
        124, and the process is gone from the sandbox."""
        with self.assertRaises(corral.CommandTimeout) as cm:
            self.sb.commands.run("echo started; sleep 600", timeout=1)
        res = cm.exception.result
        self.assertTrue(res.timed_out)
        self.assertEqual(res.exit_code, 124)
        self.assertEqual(res.end_reason, "timeout")
        self.assertEqual(res.stdout, "started\n")
        wait_for("sleep 600 to be gone",
                 lambda: "sleep 600" not in self.sb.commands.run("ps -eo args", check=False).stdout)
        r = self.sb.commands.run("sleep 600", timeout=1, check=False)
        self.assertTrue(r.timed_out)

    def test_streaming_callbacks(self):
        """on_stdout/on_stderr get each chunk as it comes, in order, and
        the first chunk arrives while the command still runs."""
        out, err = [], []
        first_seen = threading.Event()

        def on_out(s):
            out.append(s)
            first_seen.set()

        h = self.sb.commands.run("for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.3; done; read x",
                                 background=True, on_stdout=on_out, on_stderr=err.append)
        self.assertTrue(first_seen.wait(60))
        self.assertFalse(h.done)  # the command waits on stdin: output came before the end
        wait_for("three lines", lambda: "".join(out) == "1\n2\n3\n")
        h.send_stdin("go\n")
        r = h.wait()
        self.assertEqual("".join(out), "1\n2\n3\n")
        self.assertEqual("".join(err), "e1\ne2\ne3\n")
        self.assertEqual(r.stdout, "1\n2\n3\n")

    def test_foreground_callbacks_and_unicode(self):
        chunks = []
        r = self.sb.commands.run("printf 'h\\xc3\\xa9llo w\\xc3\\xb6rld\\n'", on_stdout=chunks.append)
        self.assertEqual("".join(chunks), "héllo wörld\n")
        self.assertEqual(r.stdout, "héllo wörld\n")

    def test_background_stdin_and_wait(self):
        h = self.sb.commands.run("cat; echo done", background=True)
        self.assertIn(h.pid, [p["pid"] for p in self.sb.commands.list()])
        h.send_stdin("hello ")
        h.send_stdin(b"bytes\n")
        h.close_stdin()
        r = h.wait()
        self.assertEqual(r.stdout, "hello bytes\ndone\n")

    def test_stdin_foreground(self):
        r = self.sb.commands.run("wc -c", stdin=b"x" * 200000)
        self.assertEqual(r.stdout.strip(), "200000")

    def test_background_kill(self):
        """kill() ends a background command: exit 137, and the process is
        no longer in the agent's list."""
        h = self.sb.commands.run("sleep 600", background=True, timeout=0)
        self.assertTrue(h.kill())
        with self.assertRaises(corral.CommandExitError) as cm:
            h.wait(timeout=60)
        self.assertEqual(cm.exception.exit_code, 137)
        self.assertNotIn(h.pid, [p["pid"] for p in self.sb.commands.list()])
        self.assertFalse(self.sb.commands.kill(h.pid))

    def test_sandbox_killed_under_command(self):
        """A sandbox killed while a command runs: wait() raises
        SandboxNotFound with the end reason and a 137 result."""
        sb = self.sandbox()
        h = sb.commands.run("sleep 600", background=True, timeout=0)
        self.client.kill_sandbox(sb.id)
        with self.assertRaises(corral.SandboxNotFound) as cm:
            h.wait(timeout=120)
        self.assertEqual(cm.exception.end_reason, "killed")
        self.assertEqual(cm.exception.result.exit_code, 137)

    def test_breaker_kills_under_command(self):
        """The breaker opens and kills the task's sandboxes while a
        background command runs: its wait() raises the brake's error,
        not a bare connection error."""
        task = corral.Task(client=self.client, max_calls=2, no_loop_check=True)
        sb = self.sandbox(task=task)
        h = sb.commands.run("sleep 600", background=True, timeout=0)
        sb.commands.run("true")
        with self.assertRaises(corral.BudgetExhausted):
            sb.commands.run("true")
        with self.assertRaises(corral.BudgetExhausted) as cm:
            h.wait(timeout=120)
        self.assertIn("budget_exhausted", str(cm.exception))
        self.assertEqual(cm.exception.result.exit_code, 137)

    def test_truncated(self):
        """max_output keeps the tail; truncated says bytes were dropped."""
        r = self.sb.commands.run("seq 1 100000", max_output=1000)
        self.assertTrue(r.truncated)
        self.assertEqual(len(r.stdout), 1000)
        self.assertTrue(r.stdout.endswith("99999\n100000\n"))
        self.assertEqual(r.stdout_bytes, len("".join(f"{i}\n" for i in range(1, 100001))))

    def test_exec(self):
        r = self.sb.exec(["python3", "-c", "print(6*7)"])
        self.assertEqual((r.exit_code, r.stdout), (0, "42\n"))


class FilesTest(LiveTest):
    def setUp(self):
        super().setUp()
        self.sb = self.sandbox()

    def test_text_and_bytes(self):
        f = self.sb.files
        f.write("/home/user/dir/a.txt", "héllo\n")
        self.assertEqual(f.read("/home/user/dir/a.txt"), "héllo\n")
        blob = bytes(range(256)) * 10
        f.write("b.bin", blob)  # relative to the home directory
        self.assertEqual(f.read("/home/user/b.bin", format="bytes"), blob)
        # The sandbox sees what was written.
        self.assertEqual(self.sb.commands.run("sha256sum b.bin | cut -c1-64").stdout.strip(),
                         __import__("hashlib").sha256(blob).hexdigest())

    def test_list_exists_remove_make_dir(self):
        f = self.sb.files
        self.assertTrue(f.make_dir("/tmp/pysdk/sub"))
        self.assertFalse(f.make_dir("/tmp/pysdk/sub"))
        f.write("/tmp/pysdk/x.txt", "x")
        entries = {e.name: e for e in f.list("/tmp/pysdk")}
        self.assertEqual(sorted(entries), ["sub", "x.txt"])
        self.assertEqual(entries["sub"].type, "dir")
        self.assertEqual(entries["x.txt"].type, "file")
        self.assertEqual(entries["x.txt"].size, 1)
        self.assertEqual(entries["x.txt"].path, "/tmp/pysdk/x.txt")
        self.assertTrue(f.exists("/tmp/pysdk/x.txt"))
        self.assertFalse(f.exists("/tmp/pysdk/nope"))
        moved = f.rename("/tmp/pysdk/x.txt", "/tmp/pysdk/sub/y.txt")
        self.assertEqual(moved.path, "/tmp/pysdk/sub/y.txt")
        self.assertEqual([e.name for e in f.list("/tmp/pysdk", depth=2)], ["sub", "y.txt"])
        f.remove("/tmp/pysdk")
        self.assertFalse(f.exists("/tmp/pysdk"))
        self.assertEqual(self.sb.commands.run("test -e /tmp/pysdk; echo $?").stdout, "1\n")
        f.remove("/tmp/pysdk")  # missing: no error

    def test_upload_download(self):
        data = os.urandom(3 << 20)
        self.sb.files.upload("/tmp/big.bin", io.BytesIO(data))
        out = io.BytesIO()
        n = self.sb.files.download("/tmp/big.bin", out)
        self.assertEqual(n, len(data))
        self.assertEqual(out.getvalue(), data)

    def test_missing_file_is_not_found_not_sandbox_not_found(self):
        with self.assertRaises(corral.NotFoundError) as cm:
            self.sb.files.read("/no/such/file")
        self.assertNotIsInstance(cm.exception, corral.SandboxNotFound)

    def test_user_owns_what_it_writes(self):
        self.sb.files.write("/tmp/owned-by-root", "r", user="root")
        self.assertEqual(self.sb.files.get_info("/tmp/owned-by-root").owner, "root")
        self.sb.files.write("/tmp/owned-by-user", "u")
        self.assertEqual(self.sb.files.get_info("/tmp/owned-by-user").owner, "user")


class ErrorsTest(LiveTest):
    def test_budget_exhausted(self):
        """A task of max_calls 2: the third command raises BudgetExhausted
        with the server's message telling the agent to stop."""
        task = corral.Task(client=self.client, max_calls=2, no_loop_check=True, on_trip="keep")
        sb = self.sandbox(task=task)
        sb.commands.run("true")
        sb.commands.run("echo two")
        with self.assertRaises(corral.BudgetExhausted) as cm:
            sb.commands.run("echo three")
        e = cm.exception
        self.assertIsInstance(e, corral.BrakeError)
        self.assertEqual((e.code, e.status), ("budget_exhausted", 403))
        self.assertIn("max_calls", e.message)
        self.assertIn("summarise", e.message)
        self.assertEqual(task.refresh().state, "tripped")
        # on_trip keep: the sandbox stays up, and the REST exec route
        # refuses the same way.
        self.assertEqual(self.state(sb.id), "running")
        with self.assertRaises(corral.BudgetExhausted):
            sb.exec("true")

    def test_report_tokens(self):
        """Tokens over max_tokens open the breaker: the next call is refused."""
        task = corral.Task(client=self.client, max_tokens=100, no_loop_check=True)
        sb = self.sandbox(task=task)
        self.assertEqual(task.report_tokens(60).usage["tokens"], 60)
        sb.commands.run("true")
        task.report_tokens(60)
        self.assertEqual(task.refresh().usage["tokens"], 120)
        with self.assertRaises(corral.BudgetExhausted) as cm:
            sb.commands.run("true")
        self.assertIn("max_tokens", cm.exception.message)

    def test_loop_detected(self):
        """The same failing command again and again trips the loop
        detector: LoopDetected, before the calls budget is spent."""
        task = corral.Task(client=self.client, max_calls=50)
        sb = self.sandbox(task=task)
        with self.assertRaises(corral.LoopDetected) as cm:
            for _ in range(20):
                sb.commands.run("ls /no/such/dir", check=False)
        self.assertEqual(cm.exception.code, "loop_detected")
        self.assertLess(task.refresh().usage["calls"], 20)

    def test_task_ended(self):
        task = corral.Task(client=self.client)
        sb = self.sandbox(task=task)
        sb.commands.run("true")
        self.assertEqual(task.end().state, "ended")
        with self.assertRaises(corral.TaskEnded):
            sb.commands.run("true")
        wait_for("the task's sandbox to end", lambda: self.state(sb.id) == "ended")
        with self.assertRaises(corral.TaskEnded):
            corral.Sandbox(client=self.client, task=task)

    def test_task_context_manager_ends_task(self):
        with corral.Task(client=self.client) as task:
            sb = self.sandbox(task=task)
        self.assertEqual(task.refresh().state, "ended")
        wait_for("the task's sandbox to end", lambda: self.state(sb.id) == "ended")

    def test_not_found(self):
        with self.assertRaises(corral.SandboxNotFound) as cm:
            self.client.get_sandbox("nosuchsandbox0000000")
        self.assertEqual((cm.exception.code, cm.exception.status), ("not_found", 404))
        with self.assertRaises(corral.NotFoundError):
            self.client.get_task("nosuchtask")

    def test_authentication(self):
        bad = corral.Client(api_key="e2b_" + "0" * 40)
        with self.assertRaises(corral.AuthenticationError) as cm:
            bad.list_sandboxes()
        self.assertEqual((cm.exception.code, cm.exception.status), ("unauthenticated", 401))
        with self.assertRaises(corral.AuthenticationError):
            corral.Sandbox(client=bad)

    def test_invalid_argument(self):
        with self.assertRaises(corral.InvalidArgument):
            corral.Sandbox(client=self.client, tier="enormous")

    @unittest.skipUnless(os.environ.get("CORRAL_TEST_CAPACITY_URL"),
                         "no small-capacity server: TestPythonSDK sets CORRAL_TEST_CAPACITY_URL "
                         "to one that admits a single sandbox")
    def test_capacity_exceeded(self):
        """On a server that admits one sandbox, the second create raises
        CapacityExceeded with the Retry-After hint."""
        small = corral.Client(os.environ["CORRAL_TEST_CAPACITY_URL"],
                              os.environ["CORRAL_TEST_CAPACITY_KEY"])
        with corral.Sandbox(client=small, timeout=120):
            with self.assertRaises(corral.CapacityExceeded) as cm:
                corral.Sandbox(client=small, timeout=120)
            e = cm.exception
            self.assertEqual((e.code, e.status), ("capacity_exceeded", 429))
            self.assertGreaterEqual(e.retry_after, 1)
        self.assertEqual(small.list_sandboxes(), [])


class ExecuteCodeTest(LiveTest):
    def created(self):
        return self.client.list_sandboxes(metadata={"corral_tool": "execute_code"})

    def test_runs_and_kills_what_it_made(self):
        r = tools.execute_code("import sys\nprint('hi from', sys.version_info[0])", client=self.client)
        self.assertEqual(r, {"output": "hi from 3\n", "truncated": False, "exit_code": 0,
                             "timed_out": False, "duration_ms": r["duration_ms"]})
        self.assertEqual(self.created(), [])

    def test_runaway_loop_times_out(self):
        """`while True: pass` is killed at its timeout; the sandbox made
        for it is gone; what it printed before (unflushed) is kept."""
        r = tools.execute_code("print('spinning')\nwhile True:\n    pass", timeout=2,
                               client=self.client)
        self.assertTrue(r["timed_out"])
        self.assertEqual(r["exit_code"], 124)
        self.assertEqual(r["output"], "spinning\n")
        self.assertEqual(self.created(), [])

    def test_huge_output_is_truncated(self):
        """Megabytes of output come back as the last max_output characters."""
        r = tools.execute_code("for i in range(300000):\n    print(i)", max_output=500, client=self.client)
        self.assertTrue(r["truncated"])
        self.assertEqual(len(r["output"]), 500)
        self.assertTrue(r["output"].endswith("299998\n299999\n"))
        self.assertEqual(r["exit_code"], 0)
        self.assertEqual(self.created(), [])

    def test_error_and_stderr(self):
        """stdout and stderr come in the order the program wrote them."""
        r = tools.execute_code("print('before')\n1/0", client=self.client)
        self.assertEqual(r["exit_code"], 1)
        self.assertTrue(r["output"].startswith("before\n"))
        self.assertIn("ZeroDivisionError", r["output"])

    def test_given_sandbox_is_kept(self):
        sb = self.sandbox()
        r = tools.execute_code("echo $((6*7))", language="bash", sandbox=sb)
        self.assertEqual(r["output"], "42\n")
        self.assertTrue(sb.is_running())
        self.assertEqual(sb.commands.run("ls /tmp | grep -c corral-exec || true").stdout, "0\n")

    def test_call_tool_with_json_arguments(self):
        r = tools.call_tool("execute_code", '{"code": "print(1+1)", "timeout": 20}', client=self.client)
        self.assertEqual(r["output"], "2\n")

    def test_brake_raises(self):
        """A spent budget is raised, not returned: the loop must stop."""
        task = corral.Task(client=self.client, max_calls=1, no_loop_check=True)
        sb = self.sandbox(task=task)
        tools.execute_code("print(1)", sandbox=sb)
        with self.assertRaises(corral.BudgetExhausted):
            tools.execute_code("print(2)", sandbox=sb)


class RunCodeTest(LiveTest):
    """run_code against the real code-interpreter template, when the
    server has one."""

    def setUp(self):
        super().setUp()
        if not self.client.list_templates(name="code-interpreter"):
            self.skipTest("the server has no code-interpreter template (build it to test run_code live)")
        self.sb = self.sandbox(template="code-interpreter", memory_mb=1024)

    def test_results_and_errors(self):
        ex = self.sb.run_code("x = 6 * 7\nprint('printed')\nx")
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.logs.stdout, ["printed\n"])
        self.assertIsNone(ex.error)
        ex = self.sb.run_code("1/0")
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("ZeroDivisionError", ex.error.traceback)

    def test_context_keeps_state(self):
        ctx = self.sb.create_code_context()
        self.sb.run_code("y = 5", context=ctx)
        self.assertEqual(self.sb.run_code("y * 2", context=ctx).text, "10")

    def test_streaming(self):
        out = []
        ex = self.sb.run_code("print('a')\nprint('b')", on_stdout=out.append)
        self.assertEqual("".join(out), "a\nb\n")
        self.assertEqual("".join(ex.logs.stdout), "a\nb\n")

    def test_timeout(self):
        ex = self.sb.run_code("import time\ntime.sleep(600)", timeout=2)
        self.assertTrue(ex.timed_out)
        self.assertEqual(ex.error.name, "TimeoutError")
        self.assertEqual(self.sb.run_code("1+1").text, "2")


# A stand-in for the code-interpreter server inside a base sandbox
# (test/integration/coderelay_test.go uses the same): it answers
# /execute with NDJSON lines chosen by the code, so that run_code's wire
# (the control plane's relay, the native answer, the stream) is tested
# live whether or not the server has the code-interpreter template.
FAKE_INTERPRETER = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def line(self, obj):
        b = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n" % len(b) + b + b"\r\n")
        self.wfile.flush()
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        code = req.get("code", "")
        if code == "bad-context":
            b = b"Context nope not found"
            self.send_response(404)
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.line({"type": "number_of_executions", "execution_count": 7})
        if code == "hello":
            self.line({"type": "stdout", "text": "hello\n", "timestamp": "t"})
            self.line({"type": "result", "is_main_result": True, "text": "42", "png": "aGk="})
        elif code == "fail":
            self.line({"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
                       "traceback": "Traceback: ZeroDivisionError"})
        self.line({"type": "end_of_execution"})
        self.wfile.write(b"0\r\n\r\n")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 49999), H).serve_forever()
"""


class RunCodeRelayTest(LiveTest):
    """run_code through the server's relay to a stand-in interpreter."""

    def test_relay(self):
        # The polls below are tool calls too: a budget they cannot spend.
        task = corral.Task(client=self.client, no_loop_check=True, max_calls=100000)
        sb = self.sandbox(task=task)
        with self.assertRaises(corral.UnavailableError) as cm:
            sb.run_code("hello")  # nothing listens on 49999 yet
        self.assertEqual(cm.exception.status, 503)
        sb.files.write("/tmp/fake_interpreter.py", FAKE_INTERPRETER)
        sb.commands.run("python3 /tmp/fake_interpreter.py", background=True, timeout=0)
        wait_for("the stand-in interpreter to listen", lambda: sb.commands.run(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 49999))'",
            check=False).exit_code == 0)

        ex = sb.run_code("hello", timeout=30)
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.results[0].png, b"hi")
        self.assertEqual(ex.logs.stdout, ["hello\n"])
        self.assertEqual(ex.execution_count, 7)
        self.assertIsNone(ex.error)
        self.assertFalse(ex.timed_out)

        out, results = [], []
        ex = sb.run_code("hello", on_stdout=out.append, on_result=results.append)
        self.assertEqual(out, ["hello\n"])
        self.assertEqual([r.text for r in results], ["42"])
        self.assertEqual(ex.results[0].png, b"hi")

        ex = sb.run_code("fail")
        self.assertEqual((ex.error.name, ex.error.value), ("ZeroDivisionError", "division by zero"))
        with self.assertRaises(corral.NotFoundError) as cm:
            sb.run_code("bad-context", context="nope")
        self.assertNotIsInstance(cm.exception, corral.SandboxNotFound)
        # Every run was a tool call of the task.
        self.assertGreaterEqual(task.refresh().usage["calls"], 4)


if __name__ == "__main__":
    unittest.main()
