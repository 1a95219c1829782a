// Pseudo-terminals through process.Process Start/Connect with a PTY,
// SendInput (pty bytes), Update (resize) and SendSignal.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError } from 'e2b'
import { newSandbox, rejection, assertErrorClass, waitUntil } from './helpers.mjs'

const T = { timeout: 60_000 }
const enc = new TextEncoder()

function collector() {
  const dec = new TextDecoder()
  const c = { text: '', onData: (d) => { c.text += dec.decode(d, { stream: true }) } }
  return c
}

test('pty: create, input, output, resize, kill', T, async (t) => {
  const sbx = await newSandbox(t)
  const out = collector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData })
  assert.ok(h.pid > 0)
  await sbx.pty.sendInput(h.pid, enc.encode('echo $((6*7))\n'))
  await waitUntil('42 on the terminal', 15_000, () => out.text.includes('42'))

  await sbx.pty.sendInput(h.pid, enc.encode('echo "size:$(tput cols)x$(tput lines)"\n'))
  await waitUntil('the initial size', 15_000, () => out.text.includes('size:80x24'))
  await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(h.pid, enc.encode('echo "size:$(tput cols)x$(tput lines)"\n'))
  await waitUntil('the new size', 15_000, () => out.text.includes('size:100x30'))

  await sbx.pty.sendInput(h.pid, enc.encode('echo "$TERM $(whoami) $(pwd)"\n'))
  await waitUntil('TERM, user and cwd', 15_000, () => out.text.includes('xterm-256color user /home/user'))

  const procs = await sbx.commands.list()
  assert.ok(procs.some((p) => p.pid === h.pid), 'the pty is not in commands.list()')

  assert.equal(await sbx.pty.kill(h.pid), true)
  const err = await rejection(h.wait(), 'wait of a killed pty')
  assertErrorClass(err, CommandExitError)
  assert.equal(await sbx.pty.kill(h.pid), false, 'kill of an exited pty')
})

test('pty: exit ends the session with exit code 0', T, async (t) => {
  const sbx = await newSandbox(t)
  const out = collector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData, envs: { MY_VAR: 'pty-env' }, cwd: '/tmp' })
  await sbx.pty.sendInput(h.pid, enc.encode('echo "$MY_VAR in $(pwd)"; exit\n'))
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.ok(out.text.includes('pty-env in /tmp'), `output: ${JSON.stringify(out.text)}`)
})

test('pty: connect to a running pty after disconnecting', T, async (t) => {
  const sbx = await newSandbox(t)
  const first = collector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: first.onData })
  await sbx.pty.sendInput(h.pid, enc.encode('echo first-$((1+1))\n'))
  await waitUntil('first output', 15_000, () => first.text.includes('first-2'))
  await h.disconnect()

  const second = collector()
  const h2 = await sbx.pty.connect(h.pid, { onData: second.onData })
  assert.equal(h2.pid, h.pid)
  await sbx.pty.sendInput(h.pid, enc.encode('echo second-$((2+2))\n'))
  await waitUntil('output on the new connection', 15_000, () => second.text.includes('second-4'))
  await sbx.pty.sendInput(h.pid, enc.encode('exit 5\n'))
  const err = await rejection(h2.wait(), 'wait of a pty exiting 5')
  assertErrorClass(err, CommandExitError)
  assert.equal(err.exitCode, 5)
})
