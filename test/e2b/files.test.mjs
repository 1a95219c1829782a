// Files through envd's /files endpoints and filesystem.Filesystem service:
// write/read in every format, multi-file writes, gzip, list, exists,
// getInfo, makeDir, rename, remove, watchDir, metadata and signed URLs.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { gzipSync } from 'node:zlib'
import { FileNotFoundError, NotFoundError, SandboxError, getSignature } from 'e2b'
import { newSandbox, rejection, assertErrorClass, describeError, waitUntil, sleep, accessToken, parseJSON } from './helpers.mjs'

const T = { timeout: 60_000 }

function pickWrite(w) {
  return { path: w.path, name: w.name, type: w.type }
}

test('write returns path, name and type; read returns the text', T, async (t) => {
  const sbx = await newSandbox(t)
  const w = await sbx.files.write('/home/user/a.txt', 'x')
  assert.deepEqual(pickWrite(w), { path: '/home/user/a.txt', name: 'a.txt', type: 'file' })
  assert.equal(w.metadata, undefined)
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'x')
  // Overwrite truncates.
  await sbx.files.write('/home/user/a.txt', 'y')
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'y')
  // Relative paths resolve against the user's home; parents are created.
  const rel = await sbx.files.write('rel/dir/b.txt', 'relative')
  assert.equal(rel.path, '/home/user/rel/dir/b.txt')
  assert.equal((await sbx.commands.run('cat /home/user/rel/dir/b.txt')).stdout, 'relative')
  // Empty file.
  await sbx.files.write('/home/user/empty.txt', '')
  assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
})

test('read as bytes, blob and stream', T, async (t) => {
  const sbx = await newSandbox(t)
  const data = new Uint8Array(70_000)
  for (let i = 0; i < data.length; i++) data[i] = (i * 7 + 3) & 0xff
  await sbx.files.write('/home/user/bin.dat', data.buffer)
  const bytes = await sbx.files.read('/home/user/bin.dat', { format: 'bytes' })
  assert.ok(bytes instanceof Uint8Array)
  assert.deepEqual(Buffer.from(bytes), Buffer.from(data))
  const blob = await sbx.files.read('/home/user/bin.dat', { format: 'blob' })
  assert.equal(blob.size, data.length)
  const stream = await sbx.files.read('/home/user/bin.dat', { format: 'stream' })
  const chunks = []
  for await (const c of stream) chunks.push(Buffer.from(c))
  assert.deepEqual(Buffer.concat(chunks), Buffer.from(data))
  const sum = await sbx.commands.run('sha256sum /home/user/bin.dat | cut -d" " -f1')
  const { createHash } = await import('node:crypto')
  assert.equal(sum.stdout.trim(), createHash('sha256').update(data).digest('hex'))
})

test('a 20 MB file round-trips', T, async (t) => {
  const sbx = await newSandbox(t)
  const { createHash, randomBytes } = await import('node:crypto')
  const data = randomBytes(20 << 20)
  const w = await sbx.files.write('/home/user/big.bin', data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
  assert.equal(w.path, '/home/user/big.bin')
  const sum = await sbx.commands.run('sha256sum /home/user/big.bin | cut -d" " -f1')
  assert.equal(sum.stdout.trim(), createHash('sha256').update(data).digest('hex'))
  const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
  assert.equal(back.length, data.length)
  assert.ok(Buffer.from(back).equals(data), 'downloaded bytes differ')
  assert.equal((await sbx.files.getInfo('/home/user/big.bin')).size, data.length)
})

test('write a ReadableStream and a Blob', T, async (t) => {
  const sbx = await newSandbox(t)
  const stream = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('part1-'))
      c.enqueue(new TextEncoder().encode('part2'))
      c.close()
    },
  })
  const w = await sbx.files.write('/home/user/streamed.txt', stream)
  assert.equal(w.path, '/home/user/streamed.txt')
  assert.equal(await sbx.files.read('/home/user/streamed.txt'), 'part1-part2')
  await sbx.files.write('/home/user/blob.txt', new Blob(['blob-data']))
  assert.equal(await sbx.files.read('/home/user/blob.txt'), 'blob-data')
})

test('write several files at once', T, async (t) => {
  const sbx = await newSandbox(t)
  const res = await sbx.files.write([
    { path: '/home/user/multi/one.txt', data: 'one' },
    { path: 'multi/two.txt', data: 'two' },
    { path: '/tmp/multi/three.txt', data: new TextEncoder().encode('three').buffer },
  ])
  assert.ok(Array.isArray(res))
  assert.deepEqual(res.map(pickWrite), [
    { path: '/home/user/multi/one.txt', name: 'one.txt', type: 'file' },
    { path: '/home/user/multi/two.txt', name: 'two.txt', type: 'file' },
    { path: '/tmp/multi/three.txt', name: 'three.txt', type: 'file' },
  ])
  const r = await sbx.commands.run('cat /home/user/multi/one.txt /home/user/multi/two.txt /tmp/multi/three.txt')
  assert.equal(r.stdout, 'onetwothree')
  const w2 = await sbx.files.writeFiles([{ path: '/home/user/multi/four.txt', data: 'four' }])
  assert.deepEqual(w2.map(pickWrite), [{ path: '/home/user/multi/four.txt', name: 'four.txt', type: 'file' }])
})

test('gzip upload and download', T, async (t) => {
  const sbx = await newSandbox(t)
  const text = 'compress me '.repeat(5000)
  const w = await sbx.files.write('/home/user/gz.txt', text, { gzip: true })
  assert.equal(w.path, '/home/user/gz.txt')
  // Stored decompressed.
  assert.equal((await sbx.commands.run('wc -c < /home/user/gz.txt')).stdout.trim(), String(text.length))
  assert.equal(await sbx.files.read('/home/user/gz.txt', { gzip: true }), text)
  assert.equal(await sbx.files.read('/home/user/gz.txt'), text)
  // octet-stream without gzip
  await sbx.files.write('/home/user/raw.txt', 'raw body', { useOctetStream: true })
  assert.equal(await sbx.files.read('/home/user/raw.txt'), 'raw body')
})

test('read errors: missing file, directory', T, async (t) => {
  const sbx = await newSandbox(t)
  const err = await rejection(sbx.files.read('/home/user/nope.txt'), 'read of a missing file')
  assertErrorClass(err, FileNotFoundError)
  const dirErr = await rejection(sbx.files.read('/home/user'), 'read of a directory')
  assert.ok(dirErr instanceof SandboxError, describeError(dirErr))
  const writeDir = await rejection(sbx.files.write('/home/user', 'x'), 'write onto a directory')
  assert.ok(writeDir instanceof SandboxError, describeError(writeDir))
})

test('list with depth 2: order and fields', T, async (t) => {
  const sbx = await newSandbox(t)
  const root = '/home/user/ld'
  await sbx.files.write([
    { path: `${root}/b.txt`, data: 'bb' },
    { path: `${root}/a.txt`, data: 'a' },
    { path: `${root}/sub/c.txt`, data: 'ccc' },
    { path: `${root}/sub/deep/d.txt`, data: 'd' },
  ])
  const entries = await sbx.files.list(root, { depth: 2 })
  assert.deepEqual(entries.map((e) => e.path), [
    `${root}/a.txt`,
    `${root}/b.txt`,
    `${root}/sub`,
    `${root}/sub/c.txt`,
    `${root}/sub/deep`,
  ])
  const byPath = Object.fromEntries(entries.map((e) => [e.path, e]))
  const a = byPath[`${root}/a.txt`]
  assert.equal(a.name, 'a.txt')
  assert.equal(a.type, 'file')
  assert.equal(a.size, 1)
  assert.equal(a.mode, 0o644)
  assert.equal(a.permissions, '-rw-r--r--')
  assert.equal(a.owner, 'user')
  assert.equal(a.group, 'user')
  assert.ok(a.modifiedTime instanceof Date && Math.abs(a.modifiedTime - Date.now()) < 120_000, `modifiedTime ${a.modifiedTime}`)
  const sub = byPath[`${root}/sub`]
  assert.equal(sub.type, 'dir')
  assert.equal(sub.name, 'sub')
  assert.equal(sub.permissions, 'drwxr-xr-x')
  assert.equal(sub.mode, 0o755)
  assert.equal(byPath[`${root}/sub/c.txt`].size, 3)

  const flat = await sbx.files.list(root)
  assert.deepEqual(flat.map((e) => e.name), ['a.txt', 'b.txt', 'sub'])
  const deep = await sbx.files.list(`${root}/sub/deep`)
  assert.deepEqual(deep.map((e) => e.path), [`${root}/sub/deep/d.txt`])
  await sbx.files.makeDir(`${root}/empty`)
  assert.deepEqual(await sbx.files.list(`${root}/empty`), [])
  const err = await rejection(sbx.files.list('/home/user/missing-dir'), 'list of a missing dir')
  assertErrorClass(err, NotFoundError)
})

test('exists', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/e.txt', 'e')
  assert.equal(await sbx.files.exists('/home/user/e.txt'), true)
  assert.equal(await sbx.files.exists('/home/user'), true)
  assert.equal(await sbx.files.exists('e.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/nope.txt'), false)
})

test('getInfo: file, directory, symlink, missing', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/target.txt', 'hello')
  const f = await sbx.files.getInfo('/home/user/target.txt')
  assert.equal(f.name, 'target.txt')
  assert.equal(f.path, '/home/user/target.txt')
  assert.equal(f.type, 'file')
  assert.equal(f.size, 5)
  assert.equal(f.owner, 'user')
  assert.equal(f.group, 'user')
  assert.equal(f.mode, 0o644)
  assert.equal(f.permissions, '-rw-r--r--')
  assert.equal(f.symlinkTarget, undefined)

  await sbx.commands.run('chmod 600 /home/user/target.txt')
  const f2 = await sbx.files.getInfo('/home/user/target.txt')
  assert.equal(f2.mode, 0o600)
  assert.equal(f2.permissions, '-rw-------')

  const d = await sbx.files.getInfo('/home/user')
  assert.equal(d.type, 'dir')
  assert.equal(d.owner, 'user')

  const rootFile = await sbx.files.getInfo('/etc/passwd')
  assert.equal(rootFile.owner, 'root')

  await sbx.commands.run('ln -s /home/user/target.txt /home/user/link')
  const l = await sbx.files.getInfo('/home/user/link')
  assert.equal(l.name, 'link')
  assert.equal(l.symlinkTarget, '/home/user/target.txt')
  assert.equal(l.type, 'file', 'a symlink reports its target type (envd semantics)')

  const err = await rejection(sbx.files.getInfo('/home/user/nope'), 'getInfo of a missing path')
  assertErrorClass(err, FileNotFoundError)
})

test('makeDir: true, then false when it exists; owned by user', T, async (t) => {
  const sbx = await newSandbox(t)
  assert.equal(await sbx.files.makeDir('/home/user/newdir/nested'), true)
  assert.equal(await sbx.files.makeDir('/home/user/newdir/nested'), false)
  const info = await sbx.files.getInfo('/home/user/newdir')
  assert.equal(info.type, 'dir')
  assert.equal(info.owner, 'user')
  assert.equal(info.permissions, 'drwxr-xr-x')
  assert.equal((await sbx.files.getInfo('/home/user/newdir/nested')).owner, 'user')
})

test('rename moves a file and returns the new entry', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/old.txt', 'content')
  const e = await sbx.files.rename('/home/user/old.txt', '/home/user/moved/new.txt')
  assert.equal(e.path, '/home/user/moved/new.txt')
  assert.equal(e.name, 'new.txt')
  assert.equal(e.type, 'file')
  assert.equal(await sbx.files.exists('/home/user/old.txt'), false)
  assert.equal(await sbx.files.read('/home/user/moved/new.txt'), 'content')
  const err = await rejection(sbx.files.rename('/home/user/old.txt', '/home/user/x.txt'), 'rename of a missing file')
  assertErrorClass(err, NotFoundError)
})

test('remove file and directory; removing a missing path is fine', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/rm/a/b.txt', 'b')
  await sbx.files.write('/home/user/rm.txt', 'x')
  await sbx.files.remove('/home/user/rm.txt')
  assert.equal(await sbx.files.exists('/home/user/rm.txt'), false)
  await sbx.files.remove('/home/user/rm')
  assert.equal(await sbx.files.exists('/home/user/rm'), false)
  await sbx.files.remove('/home/user/never-existed')
})

test('watchDir recursive sees a nested create', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.makeDir('/home/user/w')
  const events = []
  let exitErr
  const handle = await sbx.files.watchDir('/home/user/w', (e) => { events.push(e) }, {
    recursive: true,
    onExit: (e) => { exitErr = e },
  })
  try {
    await sbx.files.makeDir('/home/user/w/nested')
    // The watcher adds the new directory before it reports its creation:
    // once the event is here, writes into it are watched.
    await waitUntil('a create event for nested', 15_000, () =>
      events.some((e) => e.name === 'nested' && e.type === 'create'))
    await sbx.files.write('/home/user/w/nested/f.txt', 'watched')
    await waitUntil('a create event for nested/f.txt', 15_000, () =>
      events.some((e) => e.name === 'nested/f.txt' && e.type === 'create'))
      .catch((err) => assert.fail(`${err.message}; events: ${JSON.stringify(events.map((e) => [e.type, e.name]))}; watch ended with: ${exitErr ? describeError(exitErr) : 'nothing'}`))
    assert.ok(events.some((e) => e.name === 'nested' && e.type === 'create'), `events: ${JSON.stringify(events)}`)
    await sbx.files.remove('/home/user/w/nested/f.txt')
    await waitUntil('a remove event for nested/f.txt', 15_000, () =>
      events.some((e) => e.name === 'nested/f.txt' && e.type === 'remove'))
  } finally {
    await handle.stop()
  }
  assert.equal(exitErr, undefined, `watch ended with ${describeError(exitErr)}`)
})

test('watchDir non-recursive and includeEntry', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.makeDir('/home/user/w2')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/w2', (e) => { events.push(e) }, { includeEntry: true })
  try {
    await sbx.files.write('/home/user/w2/g.txt', 'x')
    await waitUntil('a create or write event for g.txt', 15_000, () =>
      events.some((e) => e.name === 'g.txt' && (e.type === 'create' || e.type === 'write')))
    const withEntry = events.find((e) => e.name === 'g.txt' && e.entry)
    assert.ok(withEntry, `no event carried an entry: ${JSON.stringify(events)}`)
    assert.equal(withEntry.entry.path, '/home/user/w2/g.txt')
  } finally {
    await handle.stop()
  }
  const err = await rejection(sbx.files.watchDir('/home/user/not-there', () => {}), 'watch of a missing dir')
  assertErrorClass(err, NotFoundError)
})

test('file metadata on write is returned and readable', T, async (t) => {
  const sbx = await newSandbox(t)
  const w = await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { Owner: 'Alice', purpose: 'test' } })
  assert.deepEqual(w.metadata, { owner: 'Alice', purpose: 'test' })
  const info = await sbx.files.getInfo('/home/user/meta.txt')
  assert.deepEqual(info.metadata, { owner: 'Alice', purpose: 'test' })
  // A later upload replaces the set.
  await sbx.files.write('/home/user/meta.txt', 'm2', { metadata: { other: 'x' } })
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta.txt')).metadata, { other: 'x' })
  await sbx.files.write('/home/user/plain.txt', 'p')
  assert.equal((await sbx.files.getInfo('/home/user/plain.txt')).metadata, undefined)
})

test('signed upload and download URLs work with a raw fetch', T, async (t) => {
  const sbx = await newSandbox(t)
  assert.ok(accessToken(sbx), 'create returned no envdAccessToken (signed URLs need one)')
  const up = await sbx.uploadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
  const u = new URL(up)
  assert.equal(u.searchParams.get('path'), '/home/user/signed.txt')
  assert.match(u.searchParams.get('signature'), /^v1_/)
  assert.ok(u.searchParams.get('signature_expiration'))
  const form = new FormData()
  form.append('file', new Blob(['hello signed']), 'signed.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  const body = await res.text()
  assert.equal(res.status, 200, body)
  assert.deepEqual(JSON.parse(body), [{ name: 'signed.txt', path: '/home/user/signed.txt', type: 'file' }])

  const down = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
  const dres = await fetch(down)
  assert.equal(dres.status, 200)
  assert.equal(await dres.text(), 'hello signed')

  // Without expiration.
  const down2 = await sbx.downloadUrl('/home/user/signed.txt')
  assert.equal(await (await fetch(down2)).text(), 'hello signed')

  // A user in the URL is part of the signature.
  const downRoot = await sbx.downloadUrl('/home/user/signed.txt', { user: 'root' })
  assert.equal(new URL(downRoot).searchParams.get('username'), 'root')
  assert.equal((await fetch(downRoot)).status, 200)
})

test('signed URLs: expired, tampered and missing signatures get 401', T, async (t) => {
  const sbx = await newSandbox(t)
  await sbx.files.write('/home/user/s.txt', 'secret')
  const token = accessToken(sbx)
  assert.ok(token, 'create returned no envdAccessToken')

  // Expired: signed with an expiration already in the past.
  const sig = await getSignature({ path: '/home/user/s.txt', operation: 'read', user: undefined, expirationInSeconds: -30, envdAccessToken: token })
  const base = new URL(await sbx.downloadUrl('/home/user/s.txt'))
  const expired = new URL(base)
  expired.searchParams.set('signature', sig.signature)
  expired.searchParams.set('signature_expiration', String(sig.expiration))
  let res = await fetch(expired)
  let text = await res.text()
  assert.equal(res.status, 401, text)
  assert.equal(parseJSON(text)?.message, 'signature is already expired', text)

  // Expired the way a user gets there: a 1 s URL used too late.
  const short = await sbx.downloadUrl('/home/user/s.txt', { useSignatureExpiration: 1 })
  await sleep(2_200)
  res = await fetch(short)
  text = await res.text()
  assert.equal(res.status, 401, text)
  assert.equal(parseJSON(text)?.message, 'signature is already expired', text)

  // Tampered: a signature for another path.
  const other = await getSignature({ path: '/home/user/other.txt', operation: 'read', user: undefined, envdAccessToken: token })
  const tampered = new URL(base)
  tampered.searchParams.set('signature', other.signature)
  res = await fetch(tampered)
  text = await res.text()
  assert.equal(res.status, 401, text)

  // A read signature does not allow a write.
  const readSig = new URL(base)
  const form = new FormData()
  form.append('file', new Blob(['overwrite']), 's.txt')
  res = await fetch(readSig, { method: 'POST', body: form })
  assert.equal(res.status, 401, await res.text())

  // Missing.
  const none = new URL(base)
  none.searchParams.delete('signature')
  res = await fetch(none)
  text = await res.text()
  assert.equal(res.status, 401, text)

  // Signed with a wrong token.
  const forged = await getSignature({ path: '/home/user/s.txt', operation: 'read', user: undefined, envdAccessToken: 'not-the-token' })
  const f = new URL(base)
  f.searchParams.set('signature', forged.signature)
  res = await fetch(f)
  assert.equal(res.status, 401, await res.text())

  assert.equal(await sbx.files.read('/home/user/s.txt'), 'secret')
})
