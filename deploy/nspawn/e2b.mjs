// E2B's SDK against the node booted under systemd (deploy/nspawn/boot.sh runs
// it with the host's Node.js in the container's network namespace):
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3001 E2B_API_KEY=e2b_... \
//   AENV_E2B_SDK_DIR=<sdk-x.y.z dir> node e2b.mjs
// Creates a sandbox, runs a command, pauses and resumes it (a file and a
// background process survive), and kills it. Prints "ok <step>" per step.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
let sbx
let bg
await step('create', async () => {
  sbx = await Sandbox.create('base', { metadata: { suite: 'systemd-boot' }, timeoutMs: 300_000 })
  assert.ok(sbx.sandboxId)
})
await step('commands.run', async () => {
  const r = await sbx.commands.run('echo hello under systemd; echo kept > /tmp/kept')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout.trim(), 'hello under systemd')
  bg = await sbx.commands.run('sleep 600', { background: true })
})
await step('pause and resume (connect)', async () => {
  assert.equal(await sbx.pause(), true)
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
  const r = await again.commands.run('cat /tmp/kept')
  assert.equal(r.stdout.trim(), 'kept')
  assert.ok((await again.commands.list()).some((p) => p.pid === bg.pid), 'the background process survived the pause')
  sbx = again
})
await step('kill', async () => {
  assert.equal(await sbx.kill(), true)
  const items = await Sandbox.list({ query: { metadata: { suite: 'systemd-boot' } } }).nextItems()
  assert.deepEqual(items.map((s) => s.sandboxId), [])
})
