// Lifecycle stress through E2B's SDK: rounds of concurrent creates, each
// sandbox running command streams and file calls right after its create and
// after a pause and connect, then kills. Every failure is printed with its
// round and sandbox; the script exits non-zero if any happened.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
const rounds = Number(process.env.AENV_STRESS_ROUNDS || '3')
const width = Number(process.env.AENV_STRESS_WIDTH || '5')
let failures = 0

async function life(round, i) {
  const sbx = await Sandbox.create('base', { metadata: { stress: `${round}-${i}` }, timeoutMs: 120_000 })
  try {
    for (let k = 0; k < 3; k++) {
      const r = await sbx.commands.run(`echo r${round}b${i}k${k}`)
      assert.equal(r.stdout, `r${round}b${i}k${k}\n`)
    }
    await sbx.files.write(`f${i}.txt`, `box ${i}\n`)
    if (i % 2 === 0) {
      await sbx.pause()
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
      const r = await again.commands.run(`cat f${i}.txt`)
      assert.equal(r.stdout, `box ${i}\n`)
    }
  } finally {
    await sbx.kill()
  }
}

for (let round = 0; round < rounds; round++) {
  const t0 = Date.now()
  const res = await Promise.allSettled(Array.from({ length: width }, (_, i) => life(round, i)))
  res.forEach((r, i) => {
    if (r.status === 'rejected') {
      failures++
      console.log(`FAIL round ${round} box ${i}:`, r.reason)
    }
  })
  console.log(`round ${round}: ${res.filter((r) => r.status === 'fulfilled').length}/${width} ok (${Date.now() - t0} ms)`)
}
console.log(failures ? `stress failed: ${failures} failures` : 'stress passed')
process.exit(failures ? 1 : 0)
