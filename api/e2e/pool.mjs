// A create from the warm pool of VMM processes, through E2B's SDK: run by
// api/e2e's TestVMMPool against a node whose pool holds the base template:
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_E2B_SDK_DIR=<sdk dir> node pool.mjs
// Prints "ok <step>" per step and "sandbox <id>"; exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')

let sbx
await step('create', async () => {
  sbx = await Sandbox.create('base', { envs: { POOLED: 'from the pool' }, timeoutMs: 120_000 })
  console.log(`sandbox ${sbx.sandboxId}`)
})

await step('commands.run sees the env vars of this create as the default user', async () => {
  const r = await sbx.commands.run('echo "$POOLED"; id -un')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'from the pool\nuser\n')
})

await step('files round-trip', async () => {
  const body = `pooled ${Date.now()}\n`.repeat(1000)
  await sbx.files.write('pooled.txt', body)
  assert.equal(await sbx.files.read('pooled.txt'), body)
  const r = await sbx.commands.run('sync; sha256sum < /home/user/pooled.txt; wc -c < /home/user/pooled.txt')
  assert.equal(r.stdout.split('\n')[1], String(body.length))
  await sbx.commands.run('echo written in the guest > /home/user/guest.txt')
  assert.equal(await sbx.files.read('guest.txt'), 'written in the guest\n')
})

await step('the guest clock was set at /init', async () => {
  const r = await sbx.commands.run('date +%s')
  const skew = Math.abs(Number(r.stdout.trim()) - Date.now() / 1000)
  assert.ok(skew < 60, `the guest clock is ${skew} s off`)
})

await step('kill', async () => {
  await sbx.kill()
})
