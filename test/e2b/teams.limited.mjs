// Two teams through the unmodified e2b SDK (both pinned versions). Not
// part of the shared suite (the name does not match *.test.mjs): it needs
// two team keys and a sandbox of team alpha, which TestTeamsEndToEnd
// (test/integration/teams_test.go) makes before it runs this file with
// E2B_API_KEY set to team beta's key.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError } from 'e2b'
import { Sandbox as LegacySandbox, SandboxNotFoundError as LegacyNotFound } from 'e2b-2.45'
import { rejection, assertErrorClass } from './helpers.mjs'

const alphaID = process.env.E2B_COMPAT_ALPHA_SANDBOX
const alphaKey = process.env.E2B_COMPAT_ALPHA_KEY
if (!alphaID || !alphaKey) {
  throw new Error('teams.limited.mjs needs two teams: run it through TestTeamsEndToEnd')
}

const T = { timeout: 60_000 }

// listIDs lists every sandbox the SDK's key sees (a paginator in 2.51, an
// array's promise in older SDKs).
async function listIDs(Sbx) {
  const p = Sbx.list()
  if (p && typeof p.nextItems === 'function') {
    const ids = []
    while (p.hasNext) {
      for (const s of await p.nextItems()) ids.push(s.sandboxId)
    }
    return ids
  }
  return (await p).map((s) => s.sandboxId)
}

for (const [name, Sbx, NotFound] of [
  ['e2b 2.51', Sandbox, SandboxNotFoundError],
  ['e2b 2.45', LegacySandbox, LegacyNotFound],
]) {
  test(`${name}: another team's sandbox is not found (getInfo, connect, kill, setTimeout) and not listed`, T, async () => {
    assertErrorClass(await rejection(Sbx.getInfo(alphaID), "getInfo of alpha's sandbox"), NotFound)
    assertErrorClass(await rejection(Sbx.connect(alphaID), "connect to alpha's sandbox"), NotFound)
    assert.equal(await Sbx.kill(alphaID), false, "kill of alpha's sandbox must report not found")
    const listed = await listIDs(Sbx)
    assert.ok(!listed.includes(alphaID), `beta's list shows alpha's sandbox: ${listed}`)
  })

  test(`${name}: the owner's key still reaches its sandbox`, T, async () => {
    const sbx = await Sbx.connect(alphaID, { apiKey: alphaKey })
    const r = await sbx.commands.run('echo owned-by-alpha')
    assert.equal(r.stdout.trim(), 'owned-by-alpha')
    const info = await Sbx.getInfo(alphaID, { apiKey: alphaKey })
    assert.equal(info.sandboxId, alphaID)
  })

  test(`${name}: a sandbox beta creates is beta's`, T, async () => {
    const sbx = await Sbx.create({ timeoutMs: 60_000 })
    try {
      assertErrorClass(await rejection(Sbx.getInfo(sbx.sandboxId, { apiKey: alphaKey }), "alpha's getInfo of beta's sandbox"), NotFound)
      assert.equal((await sbx.commands.run('echo beta')).stdout.trim(), 'beta')
    } finally {
      await sbx.kill()
    }
  })
}
