// Shared helpers of the E2B-compatibility suite. The suite drives the
// unmodified npm package `e2b` (pinned in package.json) against a corral
// server, configured exactly as a user would: E2B_API_URL and
// E2B_SANDBOX_URL point at corral, E2B_API_KEY is a corral-issued key.
// Run it with `go test -run TestE2BSDK ./test/integration/` or, against a
// running server, `node --test --test-concurrency=2 test/e2b/`.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[name]) {
    throw new Error(`${name} is not set: point E2B_API_URL and E2B_SANDBOX_URL at a corral server and set E2B_API_KEY to one of its keys`)
  }
}
if (process.env.E2B_DEBUG !== undefined) {
  throw new Error('E2B_DEBUG must not be set: it makes the SDK skip the REST API')
}

/** Base URL of the envd side (corral serves both on one address). */
export const SANDBOX_URL = process.env.E2B_SANDBOX_URL.replace(/\/+$/, '')
/** Base URL of the REST side. */
export const API_URL = process.env.E2B_API_URL.replace(/\/+$/, '')
/** Identifies this run's sandboxes in their metadata. */
export const RUN_ID = process.env.E2B_COMPAT_RUN || randomBytes(4).toString('hex')
/** The port the SDK always names in E2b-Sandbox-Port. */
export const ENVD_PORT = '49983'

/** A short random token, for unique metadata values and file names. */
export function unique(prefix = 'u') {
  return `${prefix}-${randomBytes(6).toString('hex')}`
}

/**
 * Creates a sandbox for test t (default template 'base', 120 s lifetime,
 * metadata naming the suite, run and test) and kills it when t ends.
 */
export async function newSandbox(t, opts = {}) {
  const { metadata, ...rest } = opts
  const sbx = await Sandbox.create({
    timeoutMs: 120_000,
    ...rest,
    metadata: { suite: 'corral-e2b-compat', run: RUN_ID, test: t.name.slice(0, 200), ...metadata },
  })
  t.after(async () => {
    await sbx.kill().catch(() => {})
  })
  return sbx
}

/** Polls cond every intervalMs until it returns truthy or limitMs pass. */
export async function waitUntil(what, limitMs, cond, intervalMs = 100) {
  const deadline = Date.now() + limitMs
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what} after ${limitMs} ms`)
    await sleep(intervalMs)
  }
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

/**
 * Awaits a promise that must reject and returns the error; fails when it
 * resolves. Unlike assert.rejects it hands the error back for inspection.
 */
export async function rejection(promise, what = 'the call') {
  try {
    const v = await promise
    assert.fail(`${what} resolved (${safeJSON(v)}), expected it to throw`)
  } catch (err) {
    if (err instanceof assert.AssertionError) throw err
    return err
  }
}

/** Asserts err is an instance of cls, with a useful message otherwise. */
export function assertErrorClass(err, cls) {
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${describeError(err)}`)
}

export function describeError(err) {
  if (!(err instanceof Error)) return `non-error ${safeJSON(err)}`
  return `${err.constructor?.name ?? err.name}: ${err.message}`
}

function safeJSON(v) {
  try {
    return JSON.stringify(v)?.slice(0, 300)
  } catch {
    return String(v)
  }
}

/**
 * The sandbox's envd access token. It is a protected field of the SDK's
 * Sandbox class (TypeScript only), set from the create/connect response.
 */
export function accessToken(sbx) {
  return sbx.envdAccessToken
}

/** Headers the SDK puts on every envd request for sandbox id. */
export function envdHeaders(id, token) {
  const h = { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': ENVD_PORT }
  if (token) h['X-Access-Token'] = token
  return h
}

/** A raw unary Connect-JSON call to envd, as the SDK would make it. */
export async function rawRpc(path, id, token, body = {}) {
  const res = await fetch(`${SANDBOX_URL}${path}`, {
    method: 'POST',
    headers: { ...envdHeaders(id, token), 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
    body: JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, text, json: parseJSON(text) }
}

export function parseJSON(text) {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/**
 * Returns an options object for a test the server cannot pass yet: it is
 * skipped with the reason, unless E2B_COMPAT_RUN_UNSUPPORTED=1 (to probe
 * whether the gap has been closed).
 */
export function unsupported(reason, opts = {}) {
  if (process.env.E2B_COMPAT_RUN_UNSUPPORTED === '1') return opts
  return { ...opts, skip: `corral: not supported yet (${reason})` }
}
