// Capacity refusals through the unmodified e2b SDK (both pinned versions).
// Not part of the shared suite (the name does not match *.test.mjs): it
// needs a server whose admission limit is already reached, which
// TestCapacityRefusal (test/integration/capacity_test.go) starts and
// fills before it runs this file with E2B_COMPAT_CAPACITY_FULL=1.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, RateLimitError } from 'e2b'
import { Sandbox as LegacySandbox, RateLimitError as LegacyRateLimitError } from 'e2b-2.45'
import { rejection, assertErrorClass } from './helpers.mjs'

if (process.env.E2B_COMPAT_CAPACITY_FULL !== '1') {
  throw new Error('capacity.limited.mjs needs a server at its admission limit: run it through TestCapacityRefusal')
}

const T = { timeout: 60_000 }

for (const [name, Sbx, ErrClass] of [
  ['e2b 2.51', Sandbox, RateLimitError],
  ['e2b 2.45', LegacySandbox, LegacyRateLimitError],
]) {
  test(`${name}: a create over the admission limit raises RateLimitError`, T, async () => {
    const err = await rejection(Sbx.create({ timeoutMs: 60_000 }), 'a create over the limit')
    assertErrorClass(err, ErrClass)
    assert.match(err.message, /capacity_exceeded/)
  })
}
