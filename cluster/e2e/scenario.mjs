// E2B SDK scenario against the cluster gateway. Run by cluster/e2e's Go test:
//   E2B_API_URL=<gateway> E2B_SANDBOX_URL=<gateway> E2B_API_KEY=e2b_... \
//   AENV_E2B_SDK_DIR=<sdk dir> AENV_CREATE=<n> AENV_TAG=<tag> node scenario.mjs
// (or AENV_RESUME=<json ids> to connect to paused sandboxes and read their file)
// Prints "ok <step>" per step and "ids <json>" with the sandboxes it made
// (left running for the Go test); exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
const sdkVersion = require('e2b/package.json').version
const count = Number(process.env.AENV_CREATE || '3')
const tag = process.env.AENV_TAG

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

// AENV_RESUME=<json ids>: connect to each (paused on a node since killed)
// and find the file the scenario wrote in it; nothing else.
if (process.env.AENV_RESUME) {
  await step('paused sandboxes of a dead node resume through the gateway', async () => {
    for (const id of JSON.parse(process.env.AENV_RESUME)) {
      const b = await Sandbox.connect(id, { timeoutMs: 600_000, requestTimeoutMs: 240_000 })
      assert.equal(await b.files.read('cluster.txt'), `file of ${id}\n`)
      const r = await b.commands.run('echo resumed')
      assert.equal(r.stdout, 'resumed\n')
    }
  })
  console.log('scenario passed')
  process.exit(0)
}

let boxes = []
await step(`create ${count} sandboxes through the gateway`, async () => {
  boxes = await Promise.all(Array.from({ length: count }, (_, i) =>
    Sandbox.create('base', { metadata: { suite: 'cluster-e2e', tag, n: String(i) }, timeoutMs: 600_000 })))
  assert.equal(new Set(boxes.map((b) => b.sandboxId)).size, count)
})

await step('commands run in every sandbox', async () => {
  await Promise.all(boxes.map(async (b) => {
    const r = await b.commands.run(`echo "hi from ${b.sandboxId}"`)
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, `hi from ${b.sandboxId}\n`)
  }))
})

await step('files move in and out of every sandbox', async () => {
  await Promise.all(boxes.map(async (b) => {
    await b.files.write('cluster.txt', `file of ${b.sandboxId}\n`)
    assert.equal(await b.files.read('cluster.txt'), `file of ${b.sandboxId}\n`)
  }))
})

await step('list aggregated and paginated across nodes', async () => {
  const { items, pages } = await listAll({ metadata: { tag } }, 2)
  assert.deepEqual(items.map((s) => s.sandboxId).sort(), boxes.map((b) => b.sandboxId).sort())
  assert.equal(pages, Math.ceil(count / 2))
})

await step('pause and resume through the gateway', async () => {
  const b = boxes[0]
  await b.pause()
  const { items } = await listAll({ metadata: { tag }, state: ['paused'] })
  assert.deepEqual(items.map((s) => s.sandboxId), [b.sandboxId])
  const again = await Sandbox.connect(b.sandboxId, { timeoutMs: 600_000 })
  assert.equal(await again.files.read('cluster.txt'), `file of ${b.sandboxId}\n`)
})

console.log('ids ' + JSON.stringify(boxes.map((b) => b.sandboxId)))
console.log('scenario passed')
