// Measures, with @e2b/code-interpreter unchanged, runCode("1+1") against
// commands.run("true") in one sandbox, and creates of code-interpreter-v1
// against creates of base. Prints one JSON line of medians (ms).
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.AENV_CI_SDK_DIR, 'package.json'))
const { Sandbox } = require('@e2b/code-interpreter')
const rounds = Number(process.env.AENV_BENCH_ROUNDS || 20)
const slow = { timeoutMs: 600_000, requestTimeoutMs: 3_600_000 }

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
async function timed(fn) {
  const t0 = performance.now()
  await fn()
  return performance.now() - t0
}

// The first create builds the template on the node: not measured.
const first = await Sandbox.create(slow)
await first.runCode('1+1', slow) // the kernel's first cell
const run = []
const cmd = []
for (let i = 0; i < rounds; i++) {
  run.push(await timed(async () => {
    const ex = await first.runCode('1+1', slow)
    if (ex.text !== '2') throw new Error(`runCode("1+1") gave ${JSON.stringify(ex.text)}`)
  }))
  cmd.push(await timed(async () => {
    const r = await first.commands.run('true', slow)
    if (r.exitCode !== 0) throw new Error(`commands.run("true") exited ${r.exitCode}`)
  }))
}
await first.kill()
const creates = { interp: [], base: [] }
for (let i = 0; i < 3; i++) {
  for (const [key, template] of [['interp', 'code-interpreter-v1'], ['base', 'base']]) {
    let sbx
    creates[key].push(await timed(async () => { sbx = await Sandbox.create(template, slow) }))
    await sbx.kill()
  }
}
console.log(JSON.stringify({
  runCode: median(run), commandsRun: median(cmd),
  createInterp: median(creates.interp), createBase: median(creates.base), rounds,
}))
// Exit now: an SDK call can leave a request timer armed (minutes) that
// would keep the finished script alive until it fires.
process.exit(0)
