// Sandbox ports: getHost(port) names <port>-<id>.<domain>. getHost ignores
// E2B_SANDBOX_URL, so these tests reach corral's listener with the Host
// header set to that name, as a wildcard DNS record pointing at corral
// would.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { request } from 'node:http'
import { newSandbox, waitUntil, parseJSON, SANDBOX_URL } from './helpers.mjs'

const T = { timeout: 60_000 }

/** GET path on corral's listener with Host: host. */
function getVia(host, path = '/') {
  const u = new URL(SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = request({ host: u.hostname, port: u.port, path, headers: { Host: host } }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

test('getHost: an HTTP server in the sandbox is reachable by host name', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/www/hello.txt', 'hello from the sandbox')
  await sbx.commands.run('cd /home/user/www && python3 -m http.server 8000', { background: true, timeoutMs: 0 })
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.${sbx.sandboxDomain}`)
  const res = await waitUntil('the http server through corral', 20_000, async () => {
    const r = await getVia(host, '/hello.txt').catch(() => undefined)
    return r?.status === 200 ? r : undefined
  }, 300)
  assert.equal(res.body, 'hello from the sandbox')

  // A closed port answers 502.
  const closed = await getVia(sbx.getHost(8001))
  assert.equal(closed.status, 502, closed.body)

  // After kill, the E2B proxy body.
  await sbx.kill()
  const gone = await getVia(host, '/hello.txt')
  assert.equal(gone.status, 502, gone.body)
  assert.deepEqual(parseJSON(gone.body), { sandboxId: sbx.sandboxId, message: 'The sandbox was not found', code: 502 })
})

test('getHost: envd port 49983 by host name serves /health', T, async (t) => {
  const sbx = await newSandbox(t)
  const res = await getVia(`49983-${sbx.sandboxId}.${sbx.sandboxDomain}`, '/health')
  assert.ok(res.status >= 200 && res.status < 300, `status ${res.status}: ${res.body}`)
})
