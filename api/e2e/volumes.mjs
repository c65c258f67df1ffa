// Volumes through E2B's SDK: Volume.create, list, getInfo; a sandbox of
// the base template with the volume in volumeMounts writes a file into the
// mount; a second read-write mount and a destroy while mounted are refused;
// the file survives a pause and resume and outlives the sandbox (a new
// sandbox with the volume reads it back); the volume is the size it was
// made; two sandboxes mount it read-only at once; Volume.destroy removes it.
// Run by api/e2e's Go test (volumes_test.go):
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_E2B_SDK_DIR=<sdk-x.y.z dir> [AENV_VOLUME_COLD=1] node volumes.mjs
// AENV_VOLUME_COLD=1 also pauses without memory (a cold boot on resume,
// minutes under TCG): the volume is mounted again.
// Prints "ok <step>" per step; exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox, Volume, VolumeNotFoundError } = require('e2b')
const sdkVersion = require('e2b/package.json').version
const mount = '/mnt/data'
const file = `${mount}/hello.txt`
// The size of a volume whose create names none (volume.DefaultSizeMiB).
const defaultMiB = 1024

console.log(`e2b SDK ${sdkVersion}`)
const name = `e2e-${sdkVersion.replaceAll('.', '-')}-${Date.now()}`
let vol, sbx
await step('Volume.create, list, getInfo', async () => {
  vol = await Volume.create(name)
  assert.equal(vol.name, name)
  assert.ok(vol.volumeId, 'a volume id')
  const listed = await Volume.list()
  assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === name), `listed: ${JSON.stringify(listed)}`)
  const info = await Volume.getInfo(vol.volumeId)
  assert.equal(info.volumeId, vol.volumeId)
  assert.equal(info.name, name)
  await assert.rejects(Volume.getInfo('nosuchvolume'), VolumeNotFoundError)
})

await step('Sandbox.create with volumeMounts; getInfo and list show the mount; write a file into it', async () => {
  sbx = await Sandbox.create('base', { volumeMounts: { [mount]: vol }, metadata: { volume: name }, timeoutMs: 600_000 })
  const info = await sbx.getInfo()
  assert.deepEqual(info.volumeMounts, [{ name, path: mount }])
  const listed = await Sandbox.list({ query: { metadata: { volume: name } } }).nextItems()
  assert.deepEqual(listed.map((s) => [s.sandboxId, s.volumeMounts]), [[sbx.sandboxId, [{ name, path: mount }]]])
  await sbx.files.write(file, 'written by the first sandbox')
  assert.equal(await sbx.files.read(file), 'written by the first sandbox')
  const r = await sbx.commands.run(`stat -c %U ${mount} && findmnt -n -o FSTYPE ${mount}`)
  assert.equal(r.stdout, 'user\next4\n')
})

await step('the volume has its size limit', async () => {
  const r = await sbx.commands.run(`df -B1M --output=size ${mount} | tail -1`)
  const size = Number(r.stdout.trim())
  assert.ok(size > defaultMiB * 0.9 && size <= defaultMiB, `df size ${size} MiB, want about ${defaultMiB}`)
  // More than the volume holds cannot be allocated (fallocate is instant).
  const f = await sbx.commands.run(`fallocate -l ${defaultMiB + 1}M ${mount}/big 2>&1; echo rc=$?`)
  assert.match(f.stdout, /No space left/)
  assert.doesNotMatch(f.stdout, /rc=0/)
})

await step('a second read-write mount and a destroy while mounted are refused', async () => {
  await assert.rejects(Sandbox.create('base', { volumeMounts: { '/mnt/other': name }, timeoutMs: 60_000 }), /mounted read-write/)
  await assert.rejects(Volume.destroy(vol.volumeId), /mounted by sandbox/)
})

await step('pause and resume: the file is there', async () => {
  await sbx.pause()
  sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })
  assert.equal(await sbx.files.read(file), 'written by the first sandbox')
  await sbx.files.write(file, 'written by the first sandbox after its resume')
})

if (process.env.AENV_VOLUME_COLD === '1') {
  await step('pause without memory and resume (a cold boot): the volume is mounted again', async () => {
    await sbx.pause({ keepMemory: false })
    sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })
    assert.equal(await sbx.files.read(file), 'written by the first sandbox after its resume')
  })
}

await step('kill; a new sandbox with the volume reads the file back', async () => {
  await sbx.kill()
  sbx = await Sandbox.create('base', { volumeMounts: { '/home/user/vol': name }, timeoutMs: 600_000 })
  assert.equal(await sbx.files.read('/home/user/vol/hello.txt'), 'written by the first sandbox after its resume')
  await sbx.kill()
})

// readOnly is an aenvd extension E2B's SDK does not send: the create goes
// through the API directly, the SDK connects to the sandbox.
async function createReadOnly(mountPath) {
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes`, {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', timeout: 600, volumeMounts: [{ name, path: mountPath, readOnly: true }] }),
  })
  const body = await res.text()
  assert.equal(res.status, 201, body)
  return JSON.parse(body).sandboxID
}

await step('two sandboxes mount the volume read-only at once; a read-write mount meanwhile is refused', async () => {
  const ids = [await createReadOnly('/mnt/ro'), await createReadOnly('/mnt/ro')]
  try {
    await assert.rejects(Sandbox.create('base', { volumeMounts: { '/mnt/rw': name }, timeoutMs: 60_000 }), /read-only/)
    for (const id of ids) {
      const s = await Sandbox.connect(id, { timeoutMs: 600_000 })
      assert.deepEqual((await s.getInfo()).volumeMounts, [{ name, path: '/mnt/ro', readOnly: true }])
      assert.equal(await s.files.read('/mnt/ro/hello.txt'), 'written by the first sandbox after its resume')
      const r = await s.commands.run('touch /mnt/ro/x 2>&1; echo rc=$?')
      assert.match(r.stdout, /Read-only file system/)
    }
  } finally {
    for (const id of ids) await Sandbox.kill(id)
  }
})

await step('Volume.destroy removes the volume', async () => {
  assert.equal(await Volume.destroy(vol.volumeId), true)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  assert.ok(!(await Volume.list()).some((v) => v.volumeId === vol.volumeId))
})
console.log('volumes scenario passed')
