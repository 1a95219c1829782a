// Proxy and access-control behaviour: dead sandboxes answer 502 with E2B's
// JSON body, one sandbox's access token does not open another, the API key
// is checked, and a sandbox killed mid-command ends the command with an
// actionable error.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, AuthenticationError, SandboxError } from 'e2b'
import {
  newSandbox, rejection, assertErrorClass, describeError, waitUntil, accessToken, envdHeaders, rawRpc,
  parseJSON, SANDBOX_URL, API_URL, ENVD_PORT,
} from './helpers.mjs'

const T = { timeout: 60_000 }
const WRONG_KEY = 'e2b_' + '0123456789abcdef0123456789abcdef01234567'

test('a killed sandbox answers envd requests with 502 and the E2B body', T, async (t) => {
  const sbx = await newSandbox(t)
  const id = sbx.sandboxId
  let res = await fetch(`${SANDBOX_URL}/health`, { headers: envdHeaders(id) })
  assert.ok(res.status >= 200 && res.status < 300, `/health of a running sandbox: ${res.status}`)
  await res.arrayBuffer()

  await sbx.kill()
  res = await fetch(`${SANDBOX_URL}/health`, { headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': ENVD_PORT } })
  const text = await res.text()
  assert.equal(res.status, 502, text)
  assert.deepEqual(parseJSON(text), { sandboxId: id, message: 'The sandbox was not found', code: 502 })

  // The same for an RPC and a file download, with the old token.
  const rpc = await rawRpc('/process.Process/List', id, accessToken(sbx))
  assert.equal(rpc.status, 502, rpc.text)
  const f = await fetch(`${SANDBOX_URL}/files?path=%2Fetc%2Fhostname`, { headers: envdHeaders(id, accessToken(sbx)) })
  assert.equal(f.status, 502, await f.text())
})

test('an unknown sandbox id answers 502 with the E2B body', T, async () => {
  const id = 'zzzzzzzzzzzzzzzzzzz1'
  const res = await fetch(`${SANDBOX_URL}/health`, { headers: envdHeaders(id) })
  const text = await res.text()
  assert.equal(res.status, 502, text)
  assert.deepEqual(parseJSON(text), { sandboxId: id, message: 'The sandbox was not found', code: 502 })
})

test("sandbox A refuses sandbox B's access token", T, async (t) => {
  const a = await newSandbox(t)
  const b = await newSandbox(t)
  const tokenA = accessToken(a)
  const tokenB = accessToken(b)
  assert.ok(tokenA && tokenB, 'create returned no envdAccessToken')
  assert.notEqual(tokenA, tokenB)

  const own = await rawRpc('/process.Process/List', a.sandboxId, tokenA)
  assert.equal(own.status, 200, own.text)

  const cross = await rawRpc('/process.Process/List', a.sandboxId, tokenB)
  assert.equal(cross.status, 401, cross.text)
  const none = await rawRpc('/process.Process/List', a.sandboxId, undefined)
  assert.equal(none.status, 401, none.text)
  const fsCross = await rawRpc('/filesystem.Filesystem/ListDir', a.sandboxId, tokenB, { path: '/home/user', depth: 1 })
  assert.equal(fsCross.status, 401, fsCross.text)

  await a.files.write('/home/user/private.txt', 'A only')
  const dl = await fetch(`${SANDBOX_URL}/files?path=%2Fhome%2Fuser%2Fprivate.txt`, { headers: envdHeaders(a.sandboxId, tokenB) })
  const dlText = await dl.text()
  assert.equal(dl.status, 401, dlText)
  assert.ok(!dlText.includes('A only'))

  const form = new FormData()
  form.append('file', new Blob(['evil']), 'x.txt')
  const up = await fetch(`${SANDBOX_URL}/files?path=%2Fhome%2Fuser%2Fprivate.txt`, {
    method: 'POST', headers: envdHeaders(a.sandboxId, tokenB), body: form,
  })
  assert.equal(up.status, 401, await up.text())
  assert.equal(await a.files.read('/home/user/private.txt'), 'A only')

  // A URL signed with B's token does not open A.
  const signedForB = new URL(await b.downloadUrl('/home/user/private.txt'))
  const res = await fetch(`${SANDBOX_URL}/files?${signedForB.searchParams}`, { headers: { 'E2b-Sandbox-Id': a.sandboxId, 'E2b-Sandbox-Port': ENVD_PORT } })
  assert.equal(res.status, 401, await res.text())

  // The SDK surfaces a wrong token as AuthenticationError.
  const forged = new Sandbox({ sandboxId: a.sandboxId, envdVersion: '0.6.13', envdAccessToken: tokenB })
  const err = await rejection(forged.commands.run('echo pwned'), 'run with the wrong token')
  assertErrorClass(err, AuthenticationError)
})

test('a wrong API key is refused with AuthenticationError', T, async (t) => {
  const sbx = await newSandbox(t)
  const e1 = await rejection(Sandbox.create({ apiKey: WRONG_KEY, timeoutMs: 30_000 }), 'create with a wrong key')
  assertErrorClass(e1, AuthenticationError)
  const e2 = await rejection(Sandbox.getInfo(sbx.sandboxId, { apiKey: WRONG_KEY }), 'getInfo with a wrong key')
  assertErrorClass(e2, AuthenticationError)
  const e3 = await rejection(Sandbox.list({ apiKey: WRONG_KEY }).nextItems(), 'list with a wrong key')
  assertErrorClass(e3, AuthenticationError)
  const e4 = await rejection(Sandbox.kill(sbx.sandboxId, { apiKey: WRONG_KEY }), 'kill with a wrong key')
  assertErrorClass(e4, AuthenticationError)
  assert.equal(await sbx.isRunning(), true, 'a kill with a wrong key killed the sandbox')

  // Raw: no key at all, and the E2B error body shape.
  const res = await fetch(`${API_URL}/sandboxes/${sbx.sandboxId}`)
  const text = await res.text()
  assert.equal(res.status, 401, text)
  const body = parseJSON(text)
  assert.equal(body?.code, 401, text)
  assert.equal(typeof body?.message, 'string', text)
})

test('REST error bodies carry a numeric code equal to the status', T, async () => {
  const res = await fetch(`${API_URL}/sandboxes/zzzzzzzzzzzzzzzzzzz2`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  const text = await res.text()
  assert.equal(res.status, 404, text)
  assert.equal(parseJSON(text)?.code, 404, text)
  const del = await fetch(`${API_URL}/sandboxes/zzzzzzzzzzzzzzzzzzz2`, { method: 'DELETE', headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  const delText = await del.text()
  assert.equal(del.status, 404, delText)
  assert.equal(parseJSON(delText)?.code, 404, delText)
})

test('a sandbox killed during a foreground run rejects the run', T, async (t) => {
  const sbx = await newSandbox(t)
  let out = ''
  const run = sbx.commands.run('echo started; sleep 60', { onStdout: (d) => { out += d } })
  const settled = run.then(() => ({ ok: true }), (err) => ({ err }))
  // Killed once the command is known to run.
  await waitUntil('the command to start', 30_000, () => out.includes('started'))
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)
  const res = await settled
  assert.ok(res.err, 'the run resolved after its sandbox was killed')
  t.diagnostic(`killed-during-run error: ${describeError(res.err)}`)
  assert.ok(res.err instanceof SandboxError, describeError(res.err))
  assert.match(res.err.message, /killed|end of life/, describeError(res.err))
})

test('a sandbox killed during a background command fails its wait', T, async (t) => {
  const sbx = await newSandbox(t)
  const cmd = await sbx.commands.run('sleep 60', { background: true })
  await sbx.kill()
  const err = await rejection(cmd.wait(), 'wait after the sandbox was killed')
  assert.ok(err instanceof SandboxError, describeError(err))
  assert.match(err.message, /sandbox was killed or reached its end of life/, describeError(err))
})

test('calls on a killed sandbox fail with SDK errors', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.kill()
  const e1 = await rejection(sbx.commands.run('echo hi'), 'run on a killed sandbox')
  assert.ok(e1 instanceof SandboxError, describeError(e1))
  const e2 = await rejection(sbx.files.read('/etc/hostname'), 'read on a killed sandbox')
  assert.ok(e2 instanceof SandboxError, describeError(e2))
  const e3 = await rejection(sbx.files.list('/home/user'), 'list on a killed sandbox')
  assert.ok(e3 instanceof SandboxError, describeError(e3))
})
