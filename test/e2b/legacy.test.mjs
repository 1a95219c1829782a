// The route set of e2b SDK 2.45 (POST /sandboxes, POST /sandboxes/{id}/connect
// instead of 2.51's /v2 routes), driven with the real SDK at that version
// (npm alias `e2b-2.45`): create with metadata, env vars and a timeout,
// commands, files, connect (also resuming a paused sandbox), getInfo,
// setTimeout and kill.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, SandboxNotFoundError } from 'e2b-2.45'
import { RUN_ID, unique, rejection, assertErrorClass } from './helpers.mjs'

const T = { timeout: 60_000 }

/** Creates a sandbox with SDK 2.45 and kills it when t ends. */
async function newLegacySandbox(t, opts = {}) {
  const sbx = await Sandbox.create({
    timeoutMs: 120_000,
    ...opts,
    metadata: { suite: 'corral-e2b-compat', run: RUN_ID, test: t.name.slice(0, 200), sdk: '2.45', ...opts.metadata },
  })
  t.after(async () => {
    await sbx.kill().catch(() => {})
  })
  return sbx
}

test('SDK 2.45: create, commands, files, getInfo, setTimeout, kill', T, async (t) => {
  const tag = unique('legacy')
  const sbx = await newLegacySandbox(t, { metadata: { tag }, envs: { LEGACY_MARK: tag } })
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)

  const r = await sbx.commands.run('echo $LEGACY_MARK; id -un')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, `${tag}\nuser\n`)
  const err = await rejection(sbx.commands.run('echo oops >&2; exit 3'), 'a failing command')
  assertErrorClass(err, CommandExitError)
  assert.equal(err.exitCode, 3)
  assert.equal(err.stderr, 'oops\n')

  await sbx.files.write('/home/user/legacy.txt', tag)
  assert.equal(await sbx.files.read('/home/user/legacy.txt'), tag)

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.tag, tag)
  await sbx.setTimeout(300_000)
  const later = await sbx.getInfo()
  assert.ok(later.endAt - Date.now() > 200_000, `setTimeout(300 s) left ${later.endAt - Date.now()} ms`)

  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assertErrorClass(await rejection(Sandbox.connect(sbx.sandboxId), 'connect to a killed sandbox'), SandboxNotFoundError)
})

test('SDK 2.45: connect gives a working handle and resumes a paused sandbox', T, async (t) => {
  const sbx = await newLegacySandbox(t)
  await sbx.commands.run('echo kept > /home/user/state.txt; sleep 600 >/dev/null 2>&1 &')

  const other = await Sandbox.connect(sbx.sandboxId)
  assert.equal(other.sandboxId, sbx.sandboxId)
  assert.equal((await other.commands.run('cat /home/user/state.txt')).stdout, 'kept\n')

  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await resumed.getInfo()).state, 'running')
  // Paused with memory: the background process survived.
  const r = await resumed.commands.run('cat /home/user/state.txt; pgrep -x sleep >/dev/null && echo alive')
  assert.equal(r.stdout, 'kept\nalive\n')
})
