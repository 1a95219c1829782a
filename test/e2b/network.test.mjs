// Network options of the E2B SDK mapped onto corral's egress policy:
// allowInternetAccess, network.allowOut and updateNetwork. corral is
// default-deny; names not on the list are refused by corral's proxy and DNS
// filter on the host, so nothing in this file sends traffic off the machine.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError } from 'e2b'
import { newSandbox } from './helpers.mjs'

const T = { timeout: 60_000 }

/** Runs cmd and returns {exitCode, stdout, stderr} whatever the exit code. */
async function runAny(sbx, cmd) {
  try {
    return await sbx.commands.run(cmd, { timeoutMs: 30_000 })
  } catch (e) {
    if (e instanceof CommandExitError) return e
    throw e
  }
}

test('allowOut: listed names only; others refused by the proxy with a reason', T, async (t) => {
  const sbx = await newSandbox(t, { network: { allowOut: ['allowed.invalid'], denyOut: ['0.0.0.0/0'] } })
  const info = await sbx.getInfo()
  assert.equal(info.allowInternetAccess, false)
  assert.deepEqual(info.network?.allowOut, ['allowed.invalid'])
  const r = await runAny(sbx, "curl -sS -w '\\n%{http_code}' http://example.com/")
  assert.equal(r.exitCode, 0, r.stderr)
  assert.match(r.stdout, /corral egress: refused( example.com)?: not in the allowlist/)
  assert.match(r.stdout, /403$/)
  const dns = await runAny(sbx, 'getent hosts example.com')
  assert.notEqual(dns.exitCode, 0, 'DNS for a name not on the list must fail')
})

test('allowInternetAccess false: no network; updateNetwork adds and clears a list', T, async (t) => {
  const sbx = await newSandbox(t, { allowInternetAccess: false })
  let info = await sbx.getInfo()
  assert.equal(info.allowInternetAccess, false)
  assert.equal(info.network, undefined)
  const before = await runAny(sbx, 'getent hosts example.com')
  assert.notEqual(before.exitCode, 0)

  await sbx.updateNetwork({ allowOut: ['api.example.invalid'], denyOut: ['0.0.0.0/0'] })
  info = await sbx.getInfo()
  assert.deepEqual(info.network?.allowOut, ['api.example.invalid'])
  // The sandbox now has a network (transparent proxy): a name off the
  // list is still refused, by the DNS filter.
  const refused = await runAny(sbx, 'getent hosts example.com')
  assert.notEqual(refused.exitCode, 0)
  const ip = await runAny(sbx, 'ip -4 -o addr show eth0')
  assert.equal(ip.exitCode, 0, 'the sandbox got an interface')

  await sbx.updateNetwork({})
  info = await sbx.getInfo()
  assert.equal(info.network, undefined, 'an empty update clears the list (corral default: no network)')
  const gone = await runAny(sbx, 'ip -4 -o addr show eth0')
  assert.notEqual(gone.exitCode, 0, 'the interface is removed')
})

test('unsupported network options are refused with a reason', T, async (t) => {
  await assert.rejects(
    newSandbox(t, { network: { denyOut: ['8.8.8.8'] } }),
    /denyOut of specific ranges is not supported/,
  )
})
