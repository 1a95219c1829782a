// Sandbox lifecycle through the REST control API: create, getInfo, kill,
// isRunning, setTimeout, connect, list (metadata filter, pagination) and
// create-time environment variables.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, SandboxNotFoundError } from 'e2b'
import { newSandbox, unique, waitUntil, rejection, assertErrorClass, describeError } from './helpers.mjs'

const T = { timeout: 60_000 }

test('create returns a 20-char id; getInfo reports template, state, metadata, times and size', T, async (t) => {
  const tag = unique('info')
  const sbx = await newSandbox(t, { metadata: { tag, 'with space': 'a&b=c' } })
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)

  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(typeof info.templateId, 'string')
  assert.ok(info.templateId.length > 0, 'templateId is empty')
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.tag, tag)
  assert.equal(info.metadata['with space'], 'a&b=c')
  assert.equal(info.metadata.suite, 'corral-e2b-compat')
  assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), `startedAt ${info.startedAt}`)
  assert.ok(info.endAt instanceof Date && !isNaN(info.endAt), `endAt ${info.endAt}`)
  assert.ok(info.endAt > info.startedAt, `endAt ${info.endAt.toISOString()} not after startedAt ${info.startedAt.toISOString()}`)
  const lifetime = info.endAt - info.startedAt
  assert.ok(lifetime > 100_000 && lifetime < 130_000, `lifetime ${lifetime} ms, created with timeoutMs 120000`)
  assert.ok(Math.abs(info.startedAt - Date.now()) < 60_000, `startedAt ${info.startedAt.toISOString()} is not now`)
  assert.equal(typeof info.cpuCount, 'number')
  assert.ok(info.cpuCount > 0, `cpuCount ${info.cpuCount}`)
  assert.equal(typeof info.memoryMB, 'number')
  assert.ok(info.memoryMB > 0, `memoryMB ${info.memoryMB}`)
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)

  const same = await sbx.getInfo()
  assert.equal(same.sandboxId, sbx.sandboxId)
  assert.equal(same.templateId, info.templateId)
})

test('kill: isRunning true then false; second kill false; getInfo and connect throw not found', T, async (t) => {
  const sbx = await newSandbox(t)
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  assert.equal(await sbx.kill(), false)

  const err = await rejection(Sandbox.getInfo(sbx.sandboxId), 'getInfo of a killed sandbox')
  assertErrorClass(err, NotFoundError)
  assertErrorClass(err, SandboxNotFoundError)

  const err2 = await rejection(Sandbox.connect(sbx.sandboxId), 'connect to a killed sandbox')
  assertErrorClass(err2, SandboxNotFoundError)
})

test('getInfo and kill of an id that never existed', T, async () => {
  const id = 'zzzzzzzzzzzzzzzzzzz0'
  const err = await rejection(Sandbox.getInfo(id), 'getInfo of an unknown id')
  assertErrorClass(err, SandboxNotFoundError)
  assert.equal(await Sandbox.kill(id), false)
})

test('setTimeout(5000) ends the sandbox soon after', T, async (t) => {
  const sbx = await newSandbox(t)
  const before = await sbx.getInfo()
  assert.equal(await sbx.isRunning(), true)
  await sbx.setTimeout(5000)
  const info = await sbx.getInfo()
  assert.ok(info.endAt < before.endAt, `endAt not shortened: ${before.endAt.toISOString()} -> ${info.endAt.toISOString()}`)
  assert.ok(info.endAt - Date.now() <= 6_000, `endAt ${info.endAt.toISOString()} is more than 5 s away`)
  // It must be gone some time after 5 s; the bound is generous on purpose.
  await waitUntil('the sandbox to stop after its timeout', 30_000, async () => !(await sbx.isRunning()), 500)
  const err = await rejection(Sandbox.getInfo(sbx.sandboxId), 'getInfo of an expired sandbox')
  assertErrorClass(err, SandboxNotFoundError)
})

test('setTimeout can extend the lifetime', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.setTimeout(600_000)
  const info = await sbx.getInfo()
  const left = info.endAt - Date.now()
  assert.ok(left > 590_000 && left < 610_000, `endAt ${info.endAt.toISOString()} is ${left} ms away, want ~600 s`)
})

test('Sandbox.connect returns a working handle to the same sandbox', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/from-first-handle.txt', 'hello')
  const other = await Sandbox.connect(sbx.sandboxId)
  assert.equal(other.sandboxId, sbx.sandboxId)
  const r = await other.commands.run('cat /home/user/from-first-handle.txt; echo; echo connected')
  assert.equal(r.stdout, 'hello\nconnected\n')
  assert.equal(await other.isRunning(), true)
  // connect never shortens the lifetime (E2B: running sandbox TTL is only extended).
  const before = await sbx.getInfo()
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 })
  const after = await sbx.getInfo()
  assert.ok(after.endAt >= before.endAt, `connect shortened endAt ${before.endAt.toISOString()} -> ${after.endAt.toISOString()}`)
})

test('list by metadata finds exactly the sandbox', T, async (t) => {
  const key = unique('list')
  const sbx = await newSandbox(t, { metadata: { listKey: key, 'a b': 'c&d=e' } })
  const p = Sandbox.list({ query: { metadata: { listKey: key } } })
  const items = await p.nextItems()
  assert.equal(items.length, 1, `want 1 sandbox, got ${JSON.stringify(items.map((i) => i.sandboxId))}`)
  const it = items[0]
  assert.equal(it.sandboxId, sbx.sandboxId)
  assert.equal(it.state, 'running')
  assert.equal(it.metadata.listKey, key)
  assert.ok(it.templateId, 'templateId is empty')
  assert.ok(it.startedAt instanceof Date && !isNaN(it.startedAt))
  assert.ok(it.endAt instanceof Date && it.endAt > it.startedAt)
  assert.equal(p.hasNext, false)

  // Keys and values needing escaping survive the SDK's double encoding.
  const q = await Sandbox.list({ query: { metadata: { 'a b': 'c&d=e', listKey: key } } }).nextItems()
  assert.deepEqual(q.map((i) => i.sandboxId), [sbx.sandboxId])

  const none = await Sandbox.list({ query: { metadata: { listKey: key + '-other' } } }).nextItems()
  assert.deepEqual(none, [])

  const running = await Sandbox.list({ query: { metadata: { listKey: key }, state: ['running'] } }).nextItems()
  assert.deepEqual(running.map((i) => i.sandboxId), [sbx.sandboxId])
  const paused = await Sandbox.list({ query: { metadata: { listKey: key }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused, [])

  const info = await sbx.getInfo()
  const since = await Sandbox.list({ query: { metadata: { listKey: key }, startedAfter: new Date(info.startedAt.getTime() - 1_000) } }).nextItems()
  assert.deepEqual(since.map((i) => i.sandboxId), [sbx.sandboxId])
  const later = await Sandbox.list({ query: { metadata: { listKey: key }, startedAfter: new Date(Date.now() + 60_000) } }).nextItems()
  assert.deepEqual(later, [])
  const byTemplate = await Sandbox.list({ query: { metadata: { listKey: key }, template: 'base' } }).nextItems()
  assert.deepEqual(byTemplate.map((i) => i.sandboxId), [sbx.sandboxId])
  const otherTemplate = await Sandbox.list({ query: { metadata: { listKey: key }, template: 'no-such-template' } }).nextItems()
  assert.deepEqual(otherTemplate, [])

  await sbx.kill()
  const gone = await Sandbox.list({ query: { metadata: { listKey: key } } }).nextItems()
  assert.deepEqual(gone, [], 'a killed sandbox is still listed')
})

test('list with limit 1 pages through two sandboxes, newest first', T, async (t) => {
  const key = unique('page')
  const a = await newSandbox(t, { metadata: { pageKey: key } })
  const b = await newSandbox(t, { metadata: { pageKey: key } })
  const p = Sandbox.list({ query: { metadata: { pageKey: key } }, limit: 1 })
  const first = await p.nextItems()
  assert.equal(first.length, 1)
  assert.equal(p.hasNext, true, 'hasNext after the first page of 2 with limit 1')
  const second = await p.nextItems()
  assert.equal(second.length, 1)
  assert.notEqual(second[0].sandboxId, first[0].sandboxId)
  assert.deepEqual([first[0].sandboxId, second[0].sandboxId].sort(), [a.sandboxId, b.sandboxId].sort())
  assert.equal(first[0].sandboxId, b.sandboxId, 'default order is newest first')
  if (p.hasNext) {
    const third = await p.nextItems()
    assert.deepEqual(third, [])
  }
  const asc = await Sandbox.list({ query: { metadata: { pageKey: key } }, order: 'asc' }).nextItems()
  assert.deepEqual(asc.map((i) => i.sandboxId), [a.sandboxId, b.sandboxId])
})

test('envs given at create are visible to every command', T, async (t) => {
  const sbx = await newSandbox(t, { envs: { FOO: 'bar', SPACED: 'a b  c' } })
  const r = await sbx.commands.run('echo $FOO; echo "$SPACED"')
  assert.equal(r.stdout, 'bar\na b  c\n')
  // Per-command envs override the sandbox's for that command only.
  const o = await sbx.commands.run('echo $FOO', { envs: { FOO: 'override' } })
  assert.equal(o.stdout, 'override\n')
  const again = await sbx.commands.run('echo $FOO')
  assert.equal(again.stdout, 'bar\n')
  // PTYs and background commands see them too.
  const h = await sbx.commands.run('echo $FOO', { background: true })
  const hr = await h.wait()
  assert.equal(hr.stdout, 'bar\n')
})

test('create with a wrong template fails cleanly', T, async () => {
  const err = await rejection(Sandbox.create('no-such-template-' + unique(), { timeoutMs: 30_000 }), 'create with an unknown template')
  assert.ok(err instanceof Error, describeError(err))
  assert.match(err.message, /template|not found|40\d/i, describeError(err))
})

test('getMetrics returns CPU, memory and disk samples', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.commands.run('head -c 5000000 /dev/urandom > /home/user/fill.bin && sync')
  const metrics = await waitUntil('a metrics sample', 30_000, async () => {
    const m = await sbx.getMetrics()
    return m.length > 0 ? m : undefined
  }, 1_000)
  const m = metrics[metrics.length - 1]
  assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp), `timestamp ${m.timestamp}`)
  assert.ok(Math.abs(m.timestamp - Date.now()) < 120_000, `timestamp ${m.timestamp.toISOString()} is not recent`)
  for (const k of ['cpuUsedPct', 'cpuCount', 'memUsed', 'memTotal', 'memCache', 'diskUsed', 'diskTotal']) {
    assert.equal(typeof m[k], 'number', `${k}: ${JSON.stringify(m)}`)
    assert.ok(m[k] >= 0, `${k}: ${m[k]}`)
  }
  assert.ok(m.cpuCount > 0, `cpuCount ${m.cpuCount}`)
  assert.ok(m.memTotal > 0 && m.memUsed > 0 && m.memUsed <= m.memTotal, `mem ${m.memUsed}/${m.memTotal}`)
  assert.ok(m.diskTotal > 0 && m.diskUsed <= m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`)
  // 5 MB were just written to the sandbox's disk (df inside shows them).
  let last = m
  await waitUntil('diskUsed to count the 5 MB written', 15_000, async () => {
    last = (await sbx.getMetrics()).at(-1) ?? last
    return last.diskUsed >= 4_000_000
  }, 1_000).catch((err) => assert.fail(`${err.message}; last sample ${JSON.stringify(last)}`))

  await sbx.kill()
  const err = await rejection(sbx.getMetrics(), 'getMetrics of a killed sandbox')
  assertErrorClass(err, SandboxNotFoundError)
})

test('getMetrics honours start and end', T, async (t) => {
  const sbx = await newSandbox(t)
  const future = await sbx.getMetrics({ start: new Date(Date.now() + 3_600_000), end: new Date(Date.now() + 7_200_000) })
  assert.deepEqual(future, [], 'a range in the future has no samples')
  const all = await waitUntil('a series of samples', 60_000, async () => {
    const ms = await sbx.getMetrics()
    return ms.length >= 2 ? ms : undefined
  }, 1_000)
  assert.ok(all.length >= 2, `want a series of samples, got ${all.length}`)
})

test('lifecycle onTimeout pause: the sandbox pauses at its timeout and connect resumes it', T, async (t) => {
  const sbx = await newSandbox(t, { lifecycle: { onTimeout: 'pause' } })
  await sbx.files.write('/home/user/auto.txt', 'auto')
  await sbx.setTimeout(3_000)
  await waitUntil('the sandbox to pause', 30_000, async () => (await sbx.getInfo()).state === 'paused', 500)
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await resumed.getInfo()).state, 'running')
  assert.equal(await resumed.files.read('/home/user/auto.txt'), 'auto')
})

test('pause without memory keeps files, not processes', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/keep.txt', 'kept')
  await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await resumed.files.read('/home/user/keep.txt'), 'kept')
  const r = await resumed.commands.run('pgrep -x sleep || echo none')
  assert.equal(r.stdout.trim(), 'none')
})
