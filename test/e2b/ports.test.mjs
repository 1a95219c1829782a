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

/** GET / on corral's listener with Host: host and extra headers. */
function getWith(host, headers) {
  const u = new URL(SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = request({ host: u.hostname, port: u.port, path: '/', headers: { Host: host, ...headers } }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end()
  })
}

// E2B's "sandbox requires traffic access token": a sandbox created with
// network.allowPublicTraffic false gets sbx.trafficAccessToken; its port
// refuses a request without it (403 traffic_token_required) and answers
// one that carries it in e2b-traffic-access-token, as the SDK sends it.
test('allowPublicTraffic false: ports need the traffic access token', T, async (t) => {
  const sbx = await newSandbox(t, { network: { allowPublicTraffic: false } })
  assert.equal(typeof sbx.trafficAccessToken, 'string')
  assert.ok(sbx.trafficAccessToken.length > 0)
  assert.equal((await sbx.getInfo()).network?.allowPublicTraffic, false, 'getInfo reports private ports')
  await sbx.files.write('/home/user/www/index.html', 'private hello')
  await sbx.commands.run('cd /home/user/www && python3 -m http.server 8000', { background: true, timeoutMs: 0 })
  const host = sbx.getHost(8000)
  const tok = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
  const ok = await waitUntil('the private http server through corral', 20_000, async () => {
    const r = await getWith(host, tok).catch(() => undefined)
    return r?.status === 200 ? r : undefined
  }, 300)
  assert.equal(ok.body, 'private hello')
  for (const headers of [{}, { 'e2b-traffic-access-token': 'wrong' }]) {
    const refused = await getWith(host, headers)
    assert.equal(refused.status, 403, refused.body)
    assert.equal(parseJSON(refused.body).code, 'traffic_token_required')
  }

  // A public sandbox (the SDK's default) has no token and needs none.
  const pub = await newSandbox(t)
  assert.equal(pub.trafficAccessToken, undefined)
  assert.notEqual((await pub.getInfo()).network?.allowPublicTraffic, false)
})
