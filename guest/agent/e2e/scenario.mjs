// E2B SDK scenario against aenv-agent. Run by guest/agent/e2e's Go test:
//   E2B_DEBUG=true AENV_E2B_SDK_DIR=<sdk-x.y.z dir> AENV_WORKDIR=<tmp dir> AENV_DEFAULT_USER=<agent's --default-user> AENV_OTHER_USER=<user> node scenario.mjs
// E2B_DEBUG makes the SDK skip the control API and talk to the agent on localhost:49983.
// Prints "ok <step>" per step; exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../../internal/testutil/e2bscript/steps.mjs'

const sdkDir = process.env.AENV_E2B_SDK_DIR
const work = process.env.AENV_WORKDIR
const other = process.env.AENV_OTHER_USER
const defaultUser = process.env.AENV_DEFAULT_USER
const agentURL = 'http://localhost:49983'
const require = createRequire(path.join(sdkDir, 'package.json'))
const { Sandbox, CommandExitError, FileNotFoundError, TimeoutError, AuthenticationError } = require('e2b')
const sdkVersion = require('e2b/package.json').version

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
async function waitFor(what, cond, ms = 10000) {
  const end = Date.now() + ms
  while (Date.now() < end) {
    if (await cond()) return
    await sleep(50)
  }
  throw new Error(`timed out waiting for ${what}`)
}

console.log(`e2b SDK ${sdkVersion}`)
const sbx = await Sandbox.create()

await step('commands.run output', async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, 'oops\n')
})

await step('commands.run exit code -> CommandExitError', async () => {
  await assert.rejects(sbx.commands.run('echo partial; exit 7'), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 7)
    assert.equal(err.stdout, 'partial\n')
    return true
  })
})

await step('commands.run envs and cwd', async () => {
  const r = await sbx.commands.run('echo "$GREETING"; pwd', { envs: { GREETING: 'hi there' }, cwd: work })
  assert.equal(r.stdout, `hi there\n${work}\n`)
})

await step('commands.run streams output through callbacks', async () => {
  const chunks = []
  await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.05; done', { onStdout: (d) => chunks.push(d) })
  assert.equal(chunks.join(''), 'line1\nline2\nline3\n')
})

await step('commands.run timeoutMs bounds the command', async () => {
  const marker = `aenv-timeout-${Date.now()}`
  await assert.rejects(sbx.commands.run(`sleep 30 # ${marker}`, { timeoutMs: 1000 }), (err) => err instanceof TimeoutError)
  await waitFor('timed-out command to be killed', async () =>
    !(await sbx.commands.list()).some((p) => p.args.some((a) => a.includes(marker))))
})

await step('background command, list, connect, kill', async () => {
  const h = await sbx.commands.run('sleep 60', { background: true })
  assert.ok(h.pid > 0)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), 'background pid listed')
  await h.disconnect()
  const again = await sbx.commands.connect(h.pid)
  assert.equal(again.pid, h.pid)
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(again.wait(), (err) => err instanceof CommandExitError)
  await waitFor('killed process to leave the list', async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid))
  assert.equal(await sbx.commands.kill(h.pid), false, 'kill of a gone pid is false')
})

await step('reconnect receives later output', async () => {
  const h = await sbx.commands.run('sleep 0.5; echo after-reconnect; sleep 0.3', { background: true })
  await h.disconnect()
  let seen = ''
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => { seen += d } })
  const r = await again.wait()
  assert.equal(r.exitCode, 0)
  assert.match(seen, /after-reconnect/)
})

await step('stdin', async () => {
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'hello stdin\n')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout, 'hello stdin\n')
})

await step('pty.create, sendInput, resize', async () => {
  let out = ''
  const dec = new TextDecoder()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
  await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size; echo $((6*7))x; exit\n'))
  await h.wait()
  assert.match(out, /30 100/)
  assert.match(out, /42x/)
})

const f = (name) => `${work}/${name}`
await step('files write/read/exists/getInfo', async () => {
  const info = await sbx.files.write(f('a.txt'), 'hello file')
  assert.equal(info.path, f('a.txt'))
  assert.equal(await sbx.files.read(f('a.txt')), 'hello file')
  assert.equal(await sbx.files.exists(f('a.txt')), true)
  assert.equal(await sbx.files.exists(f('missing.txt')), false)
  const st = await sbx.files.getInfo(f('a.txt'))
  assert.equal(st.type, 'file')
  assert.equal(st.size, 10)
  await assert.rejects(sbx.files.read(f('missing.txt')), (err) => err instanceof FileNotFoundError)
})

await step('files write many, bytes round trip', async () => {
  const bytes = new Uint8Array(300000).map((_, i) => (i * 7) % 251)
  const res = await sbx.files.write([
    { path: f('multi/one.bin'), data: bytes.buffer },
    { path: f('multi/two.txt'), data: 'two' },
  ])
  assert.equal(res.length, 2)
  const back = await sbx.files.read(f('multi/one.bin'), { format: 'bytes' })
  assert.deepEqual(Buffer.from(back), Buffer.from(bytes))
  assert.equal(await sbx.files.read(f('multi/two.txt')), 'two')
})

await step('files makeDir/list/rename/remove', async () => {
  assert.equal(await sbx.files.makeDir(f('dir/sub')), true)
  assert.equal(await sbx.files.makeDir(f('dir/sub')), false)
  await sbx.files.write(f('dir/sub/x.txt'), 'x')
  const names = (await sbx.files.list(f('dir'))).map((e) => e.name)
  assert.deepEqual(names, ['sub'])
  const deep = (await sbx.files.list(f('dir'), { depth: 2 })).map((e) => e.path).sort()
  assert.deepEqual(deep, [f('dir/sub'), f('dir/sub/x.txt')])
  const moved = await sbx.files.rename(f('dir/sub/x.txt'), f('dir/y.txt'))
  assert.equal(moved.path, f('dir/y.txt'))
  assert.equal(await sbx.files.read(f('dir/y.txt')), 'x')
  await sbx.files.remove(f('dir'))
  assert.equal(await sbx.files.exists(f('dir')), false)
})

await step('files watchDir', async () => {
  await sbx.files.makeDir(f('watched'))
  const events = []
  const handle = await sbx.files.watchDir(f('watched'), (e) => events.push(e), { recursive: true })
  await sbx.files.write(f('watched/new.txt'), 'data')
  await sbx.files.makeDir(f('watched/deeper'))
  await sleep(200)
  await sbx.files.write(f('watched/deeper/inner.txt'), 'data')
  await waitFor('watch events', () => events.some((e) => e.name === 'deeper/inner.txt'))
  assert.ok(events.some((e) => e.name === 'new.txt' && (e.type === 'create' || e.type === 'write')), JSON.stringify(events))
  await handle.stop()
})

await step(`default user ${defaultUser}, writes and commands as another user (${other})`, async () => {
  assert.equal((await sbx.commands.run('id -un')).stdout.trim(), defaultUser)
  assert.equal((await sbx.files.getInfo(f('a.txt'))).owner, defaultUser)
  const info = await sbx.files.write(f('theirs.txt'), 'theirs', { user: other })
  assert.equal(info.path, f('theirs.txt'))
  assert.equal((await sbx.files.getInfo(f('theirs.txt'))).owner, other)
  assert.equal((await sbx.commands.run('id -un', { user: other })).stdout.trim(), other)
  await sbx.files.makeDir(f('theirdir'), { user: other })
  assert.equal((await sbx.files.getInfo(f('theirdir'))).owner, other)
})

await step('access token and signed URLs', async () => {
  const token = 'tok_' + Math.random().toString(16).slice(2)
  const init = await fetch(`${agentURL}/init`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ accessToken: token, envVars: { FROM_INIT: 'yes' } }),
  })
  assert.equal(init.status, 204)
  const version = init.headers.get('X-Envd-Version')
  assert.ok(version, 'X-Envd-Version header')

  // The SDK object without the token is now refused, on RPCs and on /files.
  await assert.rejects(sbx.commands.run('true'), (err) => err instanceof AuthenticationError)
  await assert.rejects(sbx.files.read(f('a.txt')), (err) => err instanceof AuthenticationError)

  const secured = new Sandbox({ sandboxId: sbx.sandboxId, envdVersion: version, envdAccessToken: token, debug: true })
  const r = await secured.commands.run('echo $FROM_INIT')
  assert.equal(r.stdout, 'yes\n')

  const target = f('signed/up.txt')
  const up = await secured.uploadUrl(target, { useSignatureExpiration: 60 })
  assert.match(up, /signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['via signed url']), 'up.txt')
  const post = await fetch(up, { method: 'POST', body: form })
  assert.equal(post.status, 200, await post.clone().text())
  const down = await secured.downloadUrl(target)
  const get = await fetch(down)
  assert.equal(get.status, 200)
  assert.equal(await get.text(), 'via signed url')

  const forged = new URL(down)
  forged.searchParams.set('signature', 'v1_forged')
  assert.equal((await fetch(forged)).status, 401)
  const otherPath = new URL(down)
  otherPath.searchParams.set('path', f('a.txt'))
  assert.equal((await fetch(otherPath)).status, 401, 'a signature is bound to its path')
})

console.log('scenario passed')
process.exit(0) // open keepalive streams must not hold the process
