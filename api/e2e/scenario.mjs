// E2B SDK scenario against aenvd (control API + sandbox proxy). Run by api/e2e's Go test:
//   E2B_API_URL=http://127.0.0.1:<api> E2B_SANDBOX_URL=http://127.0.0.1:<proxy> E2B_API_KEY=e2b_... \
//   AENV_E2B_SDK_DIR=<sdk-x.y.z dir> AENV_CONCURRENT=<n> node scenario.mjs
// Prints "ok <step>" per step; exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
const sdkVersion = require('e2b/package.json').version
const concurrent = Number(process.env.AENV_CONCURRENT || '0')
const tag = `run-${process.pid}-${Date.now()}`

async function step(name, fn) {
  const t0 = Date.now()
  try {
    await fn()
    console.log(`ok ${name} (${Date.now() - t0} ms)`)
  } catch (err) {
    console.error(`FAIL ${name}:`, err)
    process.exit(1)
  }
}

async function listAll(query, limit) {
  const pager = Sandbox.list({ query, limit })
  const out = []
  let pages = 0
  while (pager.hasNext) {
    out.push(...(await pager.nextItems()))
    pages++
  }
  return { items: out, pages }
}

console.log(`e2b SDK ${sdkVersion}`)
let sbx
await step('create with metadata and env vars', async () => {
  sbx = await Sandbox.create('base', { metadata: { suite: 'aenvd-e2e', tag }, envs: { GREETING: 'hello from env' }, timeoutMs: 120_000 })
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
})

await step('commands.run sees env vars as the default user', async () => {
  const r = await sbx.commands.run('echo "$GREETING"; id -un; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello from env\nuser\n')
  assert.equal(r.stderr, 'oops\n')
})

await step('files write and read', async () => {
  await sbx.files.write('notes.txt', 'written by the SDK\n')
  assert.equal(await sbx.files.read('notes.txt'), 'written by the SDK\n')
  const r = await sbx.commands.run('cat /home/user/notes.txt')
  assert.equal(r.stdout, 'written by the SDK\n')
})

await step('list with metadata filter', async () => {
  const { items } = await listAll({ metadata: { tag } })
  assert.deepEqual(items.map((s) => s.sandboxId), [sbx.sandboxId])
  assert.equal(items[0].metadata.suite, 'aenvd-e2e')
  const none = await listAll({ metadata: { tag: 'no-such-tag' } })
  assert.equal(none.items.length, 0)
})

let info
await step('getInfo', async () => {
  info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.tag, tag)
  assert.equal(info.state, 'running')
  assert.ok(new Date(info.endAt) > new Date(info.startedAt))
})

await step('setTimeout moves endAt', async () => {
  await sbx.setTimeout(600_000)
  const after = await sbx.getInfo()
  assert.ok(new Date(after.endAt) - new Date(info.endAt) > 400_000, `endAt ${info.endAt} -> ${after.endAt}`)
})

let bgPid
await step('background process', async () => {
  const h = await sbx.commands.run('sleep 900', { background: true })
  bgPid = h.pid
  await h.disconnect()
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bgPid))
})

await step('pause; isRunning is false; listed as paused', async () => {
  await sbx.pause()
  assert.equal(await sbx.isRunning(), false)
  const { items } = await listAll({ metadata: { tag }, state: ['paused'] })
  assert.deepEqual(items.map((s) => [s.sandboxId, s.state]), [[sbx.sandboxId, 'paused']])
  const running = await listAll({ metadata: { tag }, state: ['running'] })
  assert.equal(running.items.length, 0)
})

let again
await step('connect resumes; files and background process survived', async () => {
  again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
  assert.equal(await again.isRunning(), true)
  assert.equal(await again.files.read('notes.txt'), 'written by the SDK\n')
  assert.ok((await again.commands.list()).some((p) => p.pid === bgPid), 'background process survived the pause')
  const r = await again.commands.run('echo "$GREETING"')
  assert.equal(r.stdout, 'hello from env\n')
})

if (concurrent > 0) {
  await step(`${concurrent} concurrent creates, paginated list`, async () => {
    const ctag = `${tag}-c`
    const boxes = await Promise.all(
      Array.from({ length: concurrent }, (_, i) =>
        Sandbox.create('base', { metadata: { tag: ctag, i: String(i) }, timeoutMs: 120_000 })))
    assert.equal(new Set(boxes.map((b) => b.sandboxId)).size, concurrent)
    const outs = await Promise.all(boxes.map((b, i) => b.commands.run(`echo box${i}`)))
    outs.forEach((r, i) => assert.equal(r.stdout, `box${i}\n`))
    const { items, pages } = await listAll({ metadata: { tag: ctag } }, 2)
    assert.equal(items.length, concurrent)
    assert.equal(pages, Math.ceil(concurrent / 2))
    assert.equal(new Set(items.map((s) => s.sandboxId)).size, concurrent)
    await Promise.all(boxes.map((b) => b.kill()))
  })
}

await step('kill; gone from list; second kill reports false', async () => {
  assert.equal(await again.kill(), true)
  const { items } = await listAll({ metadata: { tag } })
  assert.equal(items.length, 0)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})

console.log('scenario passed')
