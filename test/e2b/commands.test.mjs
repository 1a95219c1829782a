// Commands through envd's process.Process service: run, exit codes,
// streaming callbacks, envs, cwd, users, background handles, stdin,
// reconnecting, timeouts and the base image's tools.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError, SandboxError } from 'e2b'
import { newSandbox, rejection, assertErrorClass, describeError, waitUntil } from './helpers.mjs'

const T = { timeout: 60_000 }

test('run echo hi', T, async (t) => {
  const sbx = await newSandbox(t)
  const r = await sbx.commands.run('echo hi')
  assert.equal(r.stdout, 'hi\n')
  assert.equal(r.stderr, '')
  assert.equal(r.exitCode, 0)
  assert.equal(r.error, undefined)
})

test('non-zero exit throws CommandExitError with the exit code and output', T, async (t) => {
  const sbx = await newSandbox(t)
  const err = await rejection(sbx.commands.run('echo before; echo oops >&2; exit 3'), 'run of exit 3')
  assertErrorClass(err, CommandExitError)
  assert.equal(err.exitCode, 3)
  assert.equal(err.stdout, 'before\n')
  assert.equal(err.stderr, 'oops\n')
})

test('onStdout and onStderr receive the output as it comes', T, async (t) => {
  const sbx = await newSandbox(t)
  let out = ''
  let errOut = ''
  const r = await sbx.commands.run('echo out1; echo err1 >&2; sleep 0.2; echo out2', {
    onStdout: (d) => { out += d },
    onStderr: (d) => { errOut += d },
  })
  assert.equal(out, 'out1\nout2\n')
  assert.equal(errOut, 'err1\n')
  assert.equal(r.stdout, 'out1\nout2\n')
  assert.equal(r.stderr, 'err1\n')
})

test('large output arrives complete', T, async (t) => {
  const sbx = await newSandbox(t)
  const r = await sbx.commands.run('seq 1 100000')
  const lines = r.stdout.trimEnd().split('\n')
  assert.equal(lines.length, 100000)
  assert.equal(lines[99999], '100000')
})

test('envs and cwd options', T, async (t) => {
  const sbx = await newSandbox(t)
  const e = await sbx.commands.run('echo "$A-$B"', { envs: { A: '1', B: 'two words' } })
  assert.equal(e.stdout, '1-two words\n')
  const leak = await sbx.commands.run('echo "${A:-unset}"')
  assert.equal(leak.stdout, 'unset\n', 'per-command envs leaked into a later command')
  const c = await sbx.commands.run('pwd', { cwd: '/tmp' })
  assert.equal(c.stdout, '/tmp\n')
  const bad = await rejection(sbx.commands.run('pwd', { cwd: '/does/not/exist' }), 'run with a missing cwd')
  assert.ok(bad instanceof SandboxError, describeError(bad))
})

test('default user is user in /home/user; user root; passwordless sudo', T, async (t) => {
  const sbx = await newSandbox(t)
  assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  assert.equal((await sbx.commands.run('echo $HOME')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('id -gn')).stdout, 'user\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  assert.equal((await sbx.commands.run('pwd', { user: 'root' })).stdout, '/root\n')
  const s = await sbx.commands.run('sudo -n true && sudo -n whoami')
  assert.equal(s.exitCode, 0)
  assert.equal(s.stdout, 'root\n')
})

test('E2B_SANDBOX=true is set for every process (envd sets it)', T, async (t) => {
  const sbx = await newSandbox(t)
  assert.equal((await sbx.commands.run('echo "$E2B_SANDBOX"')).stdout, 'true\n')
  assert.equal((await sbx.commands.run('echo "$E2B_SANDBOX"', { user: 'root' })).stdout, 'true\n')
})

test('stdin is closed for foreground commands by default', T, async (t) => {
  const sbx = await newSandbox(t)
  const r = await sbx.commands.run('cat; echo after-cat')
  assert.equal(r.stdout, 'after-cat\n')
})

test('background command: list, kill, wait throws CommandExitError', T, async (t) => {
  const sbx = await newSandbox(t)
  const h = await sbx.commands.run('sleep 100', { background: true })
  assert.equal(typeof h.pid, 'number')
  assert.ok(h.pid > 0)
  const procs = await sbx.commands.list()
  const p = procs.find((x) => x.pid === h.pid)
  assert.ok(p, `pid ${h.pid} not in commands.list(): ${JSON.stringify(procs)}`)
  assert.equal(p.cmd, '/bin/bash')
  assert.deepEqual(p.args, ['-l', '-c', 'sleep 100'])
  assert.equal(await h.kill(), true)
  const err = await rejection(h.wait(), 'wait of a killed command')
  assertErrorClass(err, CommandExitError)
  assert.notEqual(err.exitCode, 0)
  await waitUntil('the killed command to leave commands.list()', 10_000, async () =>
    !(await sbx.commands.list()).some((x) => x.pid === h.pid))
  assert.equal(await sbx.commands.kill(h.pid), false, 'kill of an exited pid')
  assert.equal(await sbx.commands.kill(999_999), false, 'kill of an unknown pid')
})

test('background command finishes on its own', T, async (t) => {
  const sbx = await newSandbox(t)
  const h = await sbx.commands.run('sleep 0.5; echo done', { background: true })
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'done\n')
  assert.equal(h.exitCode, 0)
})

test('stdin: sendStdin then closeStdin', T, async (t) => {
  const sbx = await newSandbox(t)
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'abc\n')
  await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('def\n'))
  await sbx.commands.closeStdin(h.pid)
  const r = await h.wait()
  assert.equal(r.stdout, 'abc\ndef\n')
  assert.equal(r.exitCode, 0)
})

test('stdin through the handle', T, async (t) => {
  const sbx = await newSandbox(t)
  const h = await sbx.commands.run('wc -c', { background: true, stdin: true })
  await h.sendStdin('12345')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout.trim(), '5')
})

test('commands.connect to a running command receives its later output', T, async (t) => {
  const sbx = await newSandbox(t)
  // The command waits for /tmp/go, written once connect has returned, so
  // its output comes after the connection however slow the machine is.
  const h = await sbx.commands.run('while [ ! -e /tmp/go ]; do sleep 0.1; done; echo later; exit 4', { background: true })
  let seen = ''
  const c = await sbx.commands.connect(h.pid, { onStdout: (d) => { seen += d } })
  assert.equal(c.pid, h.pid)
  await sbx.files.write('/tmp/go', '')
  const err = await rejection(c.wait(), 'wait of a command exiting 4')
  assertErrorClass(err, CommandExitError)
  assert.equal(err.exitCode, 4)
  assert.equal(seen, 'later\n')
  assert.equal(err.stdout, 'later\n')
  const err2 = await rejection(h.wait(), 'wait on the original handle')
  assert.equal(err2.exitCode, 4)
})

test('commands.connect to an unknown pid fails', T, async (t) => {
  const sbx = await newSandbox(t)
  const err = await rejection(sbx.commands.connect(999_999), 'connect to an unknown pid')
  assert.ok(err instanceof SandboxError, describeError(err))
})

test('timeoutMs ends a long command', T, async (t) => {
  const sbx = await newSandbox(t)
  const start = Date.now()
  // sleep 600 cannot end on its own during the test: the rejection is the
  // timeout's doing.
  const err = await rejection(sbx.commands.run('sleep 600', { timeoutMs: 1000 }), 'run of sleep 600 with timeoutMs 1000')
  const took = Date.now() - start
  t.diagnostic(`timeoutMs error: ${describeError(err)} after ${took} ms`)
  assert.ok(err instanceof SandboxError, describeError(err))
  // The process is gone too: envd's Connect-Timeout-Ms sets the process lifetime.
  await waitUntil('sleep 600 to be killed', 30_000, async () =>
    !(await sbx.commands.list()).some((p) => p.args?.includes('sleep 600')))
})

test('base image tools: python3, python, git, curl, tput', T, async (t) => {
  const sbx = await newSandbox(t)
  const py = await sbx.commands.run('python3 -c "print(6*7)"')
  assert.equal(py.stdout, '42\n')
  const py2 = await sbx.commands.run('python -c "import sys; print(sys.version_info[0])"')
  assert.equal(py2.stdout, '3\n')
  for (const tool of ['git', 'curl', 'tput', 'bash', 'sh', 'sudo']) {
    const r = await sbx.commands.run(`which ${tool}`)
    assert.equal(r.exitCode, 0, `${tool} missing`)
    assert.match(r.stdout, new RegExp(`/${tool}\\n$`))
  }
})

test('commands run concurrently', T, async (t) => {
  const sbx = await newSandbox(t)
  // Each command marks that it runs, then waits until all five have: run
  // one after another, the first would wait for the others in vain and
  // fail (exit 3 after 60 s).
  const cmd = (i) => `touch /tmp/c${i}; n=0; while [ "$(ls /tmp | grep -c '^c[1-5]$')" -lt 5 ]; do n=$((n+1)); [ $n -gt 600 ] && exit 3; sleep 0.1; done; echo ${i}`
  const rs = await Promise.all([1, 2, 3, 4, 5].map((i) => sbx.commands.run(cmd(i), { timeoutMs: 120_000 })))
  assert.deepEqual(rs.map((r) => r.stdout), ['1\n', '2\n', '3\n', '4\n', '5\n'])
})
