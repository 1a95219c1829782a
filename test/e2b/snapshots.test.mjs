// Snapshots and fork through the E2B SDK: a snapshot saves a sandbox's
// files (not its processes) and can be used as a template; fork starts
// copies.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { newSandbox, unique } from './helpers.mjs'

const T = { timeout: 60_000 }

test('snapshots: create, list, start from, delete', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/snap.txt', 'in snapshot')
  const snap = await sbx.createSnapshot({ name: unique('snap') })
  assert.ok(snap.snapshotId)
  const listed = await sbx.listSnapshots().nextItems()
  assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId))
  const child = await newSandbox(t, { template: snap.snapshotId })
  assert.equal(await child.files.read('/home/user/snap.txt'), 'in snapshot')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  await assert.rejects(newSandbox(t, { template: snap.snapshotId }), 'a deleted snapshot starts no sandbox')
  assert.equal(await child.files.read('/home/user/snap.txt'), 'in snapshot', 'a sandbox started from a deleted snapshot keeps working')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'already deleted')
})

test('fork copies the filesystem', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/fork.txt', 'forked')
  const [fork] = await sbx.fork({ count: 1 })
  assert.ok(fork instanceof Sandbox, String(fork))
  t.after(() => fork.kill().catch(() => {}))
  assert.notEqual(fork.sandboxId, sbx.sandboxId)
  assert.equal(await fork.files.read('/home/user/fork.txt'), 'forked')
})
