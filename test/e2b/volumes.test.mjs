// Volumes: corral volumes through E2B's volume API (POST/GET/DELETE
// /volumes) and `volumeMounts` at create. A volume outlives the sandboxes
// that mount it and cannot be destroyed while one does.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeError, VolumeNotFoundError } from 'e2b'
import { newSandbox, unique, rejection, assertErrorClass } from './helpers.mjs'

const T = { timeout: 60_000 }

test('volumes: create, mount, persist across sandboxes, destroy', T, async (t) => {
  const name = unique('vol')
  const vol = await Volume.create(name)
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))
  assert.equal(vol.name, name)
  assert.match(vol.volumeId, /^vol[a-z0-9]+$/)

  const info = await Volume.getInfo(vol.volumeId)
  assert.equal(info.name, name)
  assert.ok(info.token, 'getInfo returns the content token')
  assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === name))

  const a = await newSandbox(t, { volumeMounts: { '/mnt/vol': vol } })
  await a.files.write('/mnt/vol/x.txt', 'on volume')
  assert.equal(await a.files.read('/mnt/vol/x.txt'), 'on volume')
  const detail = await Sandbox.getInfo(a.sandboxId)
  assert.deepEqual(detail.volumeMounts, [{ name, path: '/mnt/vol' }])

  // Mounted: destroy refuses.
  const busy = await rejection(Volume.destroy(vol.volumeId), 'destroy of a mounted volume')
  assertErrorClass(busy, VolumeError)
  await a.kill()

  // A second sandbox, mounting it by name elsewhere, sees the file.
  const b = await newSandbox(t, { volumeMounts: { '/home/user/data': name } })
  assert.equal(await b.files.read('/home/user/data/x.txt'), 'on volume')
  await b.kill()

  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  assertErrorClass(await rejection(Volume.getInfo(vol.volumeId), 'getInfo of a destroyed volume'), VolumeNotFoundError)
})

test('volumes: a mount of an unknown volume or at a reserved path is refused', T, async (t) => {
  const err = await rejection(newSandbox(t, { volumeMounts: { '/data': unique('missing') } }), 'create with an unknown volume')
  assert.match(String(err.message), /does not exist/)
  const vol = await Volume.create(unique('vol'))
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))
  const err2 = await rejection(newSandbox(t, { volumeMounts: { '/etc': vol } }), 'create with a volume on /etc')
  assert.match(String(err2.message), /reserved/)
})

test('volume content API: files written from outside and from a sandbox meet; links out of the volume are refused', T, async (t) => {
  const vol = await Volume.create(unique('vol'))
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))

  const dir = await vol.makeDir('/notes')
  assert.equal(dir.type, 'directory')
  const f = await vol.writeFile('/notes/a.txt', 'hello')
  assert.equal(f.type, 'file')
  assert.equal(f.size, 5)
  assert.equal(f.uid, 1000)
  assert.equal(await vol.readFile('/notes/a.txt'), 'hello')
  assert.deepEqual((await vol.list('/notes')).map((e) => e.name), ['a.txt'])
  assert.equal(await vol.exists('/notes/a.txt'), true)
  assert.equal(await vol.exists('/notes/none.txt'), false)
  const chmoded = await vol.updateMetadata('/notes/a.txt', { mode: 0o600 })
  assert.equal(chmoded.mode & 0o777, 0o600)

  const sbx = await newSandbox(t, { volumeMounts: { '/data': vol } })
  const r = await sbx.commands.run("cat /data/notes/a.txt; echo; stat -c '%U %a' /data/notes/a.txt; echo from-sandbox > /data/s.txt; ln -s /etc/hostname /data/escape; ln -s ../../../../etc /data/up")
  assert.equal(r.stdout, 'hello\nuser 600\n')
  assert.equal(await vol.readFile('/s.txt'), 'from-sandbox\n')

  // A link the sandbox planted never leads the content API out of the volume.
  await rejection(vol.readFile('/escape'), 'read through an absolute link')
  await rejection(vol.readFile('/up/passwd'), 'read through a relative link out')
  await rejection(vol.writeFile('/up/evil', 'x'), 'write through a link out')

  // A wrong token is refused.
  const forged = new Volume(vol.volumeId, vol.name, 'not-the-token')
  await rejection(forged.readFile('/notes/a.txt'), 'read with a wrong token')

  await vol.remove('/notes')
  assert.equal(await vol.exists('/notes'), false)
  // Hooks run in the order they were added: the volume's destroy would
  // come before the sandbox's kill and be refused, so end the sandbox now.
  await sbx.kill()
})
