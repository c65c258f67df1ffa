// E2B's Code Interpreter SDK (@e2b/code-interpreter), unchanged, against one
// node: Sandbox.create() starts code-interpreter-v1 (built by the node on
// its first use), runCode runs cells in its Jupyter kernels through the
// proxy's port 49999. Run by api/e2e's TestE2BCodeInterpreter:
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_CI_SDK_DIR=<dir> node codeinterp.mjs
// Prints "ok <step>" per step; runs every step and exits non-zero if any
// failed. Waits are generous (Python under emulation is slow); nothing is
// timed.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { check, finish } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_CI_SDK_DIR, 'package.json'))
const { Sandbox } = require('@e2b/code-interpreter')
console.log(`@e2b/code-interpreter ${require('@e2b/code-interpreter/package.json').version}`)

const slow = { timeoutMs: 600_000, requestTimeoutMs: 600_000 }

// The first create builds the template on the node: minutes under emulation.
let sbx = await Sandbox.create({ timeoutMs: 1_800_000, requestTimeoutMs: 3_600_000 })
console.log(`sandbox ${sbx.sandboxId}`)

await check('the template is listed, ready', async () => {
  const res = await fetch(`${process.env.E2B_API_URL}/templates`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
  assert.equal(res.status, 200)
  const list = await res.json()
  const t = list.find((t) => t.templateID === 'code-interpreter-v1' || (t.aliases ?? []).includes('code-interpreter-v1'))
  assert.ok(t, `code-interpreter-v1 not in ${JSON.stringify(list.map((t) => t.templateID))}`)
})

await check('state is kept across runCode calls', async () => {
  await sbx.runCode('x = 41', slow)
  const ex = await sbx.runCode('x += 1\nx', slow)
  assert.equal(ex.error, undefined)
  assert.equal(ex.text, '42')
  assert.ok(ex.executionCount >= 2, `executionCount ${ex.executionCount}`)
})

await check('stdout and stderr are streamed to the callbacks', async () => {
  const out = []
  const err = []
  const ex = await sbx.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)', {
    ...slow, onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line),
  })
  assert.equal(out.join(''), 'to out\n')
  assert.equal(err.join(''), 'to err\n')
  assert.deepEqual(ex.logs, { stdout: ['to out\n'], stderr: ['to err\n'] })
})

await check('an exception comes back with its traceback', async () => {
  let seen
  const ex = await sbx.runCode('def f():\n    return 1/0\nf()', { ...slow, onError: (e) => { seen = e } })
  assert.equal(ex.error.name, 'ZeroDivisionError')
  assert.equal(ex.error.value, 'division by zero')
  const plain = ex.error.traceback.replace(/\x1b\[[0-9;]*m/g, '') // IPython colours it
  assert.match(plain, /return 1\/0/)
  assert.match(plain, /ZeroDivisionError/)
  assert.equal(seen.name, 'ZeroDivisionError')
})

await check('a matplotlib chart is a PNG result', async () => {
  const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()', slow)
  assert.equal(ex.error, undefined)
  const png = ex.results.find((r) => r.png)
  assert.ok(png, `no PNG among ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
  const bytes = Buffer.from(png.png, 'base64')
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
  assert.ok(png.formats().includes('png'))
})

await check('a pandas DataFrame comes back as HTML and text', async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "temp": [3, 19]})', slow)
  assert.equal(ex.error, undefined)
  const r = ex.results.find((r) => r.isMainResult)
  assert.match(r.html, /<table[\s\S]*Oslo[\s\S]*Lima/)
  assert.match(r.text, /city\s+temp/)
})

await check('other display formats: markdown and JSON', async () => {
  const ex = await sbx.runCode('from IPython.display import Markdown, JSON, display\ndisplay(Markdown("**bold**"))\ndisplay(JSON({"a": 1}))', slow)
  assert.equal(ex.error, undefined)
  assert.ok(ex.results.some((r) => r.markdown === '**bold**'), JSON.stringify(ex.results))
  assert.ok(ex.results.some((r) => r.json && r.json.a === 1), JSON.stringify(ex.results))
})

await check('env vars hold for one execution', async () => {
  const ex = await sbx.runCode('import os\nos.environ.get("AENV_CI")', { ...slow, envs: { AENV_CI: 'set' } })
  assert.equal(ex.text, "'set'")
  const after = await sbx.runCode('import os\nos.environ.get("AENV_CI")', slow)
  assert.equal(after.text, undefined) // None has no result
})

await check('bash and JavaScript cells', async () => {
  const b = await sbx.runCode('echo "$GREETING from $(basename $PWD)"', { ...slow, language: 'bash', envs: { GREETING: 'hi' } })
  assert.deepEqual(b.logs.stdout, ['hi from user\n'])
  const bad = await sbx.runCode('exit 3', { ...slow, language: 'bash' })
  assert.match(bad.error.value, /code 3/)
  const js = await sbx.runCode('console.log([1, 2, 3].map((n) => n * 2).join(","))', { ...slow, language: 'js' })
  assert.deepEqual(js.logs.stdout, ['2,4,6\n'])
})

let a, b
await check('two contexts are isolated, each in its own directory', async () => {
  a = await sbx.createCodeContext({ cwd: '/tmp', ...slow })
  b = await sbx.createCodeContext({ language: 'python', ...slow })
  assert.equal(a.language, 'python')
  assert.equal(a.cwd, '/tmp')
  await sbx.runCode('secret = "a"', { ...slow, context: a })
  const inB = await sbx.runCode('secret', { ...slow, context: b })
  assert.equal(inB.error.name, 'NameError')
  const cwd = await sbx.runCode('import os\nos.getcwd()', { ...slow, context: a })
  assert.equal(cwd.text, "'/tmp'")
  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id), JSON.stringify(ids))
  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === b.id))
  await assert.rejects(sbx.runCode('1', { ...slow, context: b }), /not found/)
})

await check('a restart drops the context state', async () => {
  assert.equal((await sbx.runCode('secret', { ...slow, context: a })).text, "'a'")
  await sbx.restartCodeContext(a)
  const ex = await sbx.runCode('secret', { ...slow, context: a })
  assert.equal(ex.error.name, 'NameError')
})

await check('a timeout interrupts the kernel', async () => {
  await assert.rejects(sbx.runCode('import time\nwhile True:\n    time.sleep(0.1)', { timeoutMs: 5_000 }), /timed out/i)
  // The loop was interrupted: the context runs the next cell (it would
  // wait behind the loop otherwise) and keeps its state.
  const ex = await sbx.runCode('x', slow)
  assert.equal(ex.text, '42')
})

await check('pause and resume keep the kernel variables', async () => {
  await sbx.runCode('kept = [1, 2, 3]', slow)
  assert.equal(await sbx.pause(), true)
  sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })
  const ex = await sbx.runCode('sum(kept) + x', slow)
  assert.equal(ex.text, '48')
})

await check('a fork (the node API) keeps the kernel variables; the child is its own', async () => {
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes/${sbx.sandboxId}/fork`, {
    method: 'POST', headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ count: 1, timeout: 600 }),
  })
  assert.equal(res.status, 201, await res.clone().text())
  const [child] = await res.json()
  assert.ok(child.sandbox, JSON.stringify(child))
  const c = await Sandbox.connect(child.sandbox.sandboxID, { timeoutMs: 600_000 })
  try {
    assert.equal((await c.runCode('kept.append(4)\nsum(kept)', slow)).text, '10')
    assert.equal((await sbx.runCode('sum(kept)', slow)).text, '6')
  } finally {
    await c.kill().catch(() => {})
  }
})

await sbx.kill().catch(() => {})
finish('code interpreter scenario passed')
