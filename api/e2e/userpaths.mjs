// What a new user tries with E2B's SDK against one node, pointed at it with
// E2B_SANDBOX_URL (docs/e2b-compat.md): signed file URLs fetched as they
// are, a server in the sandbox called through sbx.getHost(port), a PTY
// reconnected, a background timer across a pause, the SDK's template
// builder with copy. Run by api/e2e's
// TestE2BUserPaths:
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_E2B_SDK_DIR=<sdk dir> node userpaths.mjs
// Prints "ok <step>" per step; runs every step and exits non-zero if any failed.
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import { createRequire } from 'node:module'
import path from 'node:path'
import { check, finish } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox, Template } = require('e2b')
console.log(`e2b SDK ${require('e2b/package.json').version}`)


// until polls fn every 200 ms until it returns a value other than
// undefined, at most n times.
async function until(n, fn) {
  for (let i = 0; i < n; i++) {
    const v = await fn().catch(() => undefined)
    if (v !== undefined) return v
    await new Promise((r) => setTimeout(r, 200))
  }
  throw new Error('gave up waiting')
}

const sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
const proxy = new URL(process.env.E2B_SANDBOX_URL)

await check('downloadUrl: the signed URL, fetched as it is', async () => {
  await sbx.files.write('down.txt', 'downloaded')
  for (const opts of [undefined, { useSignatureExpiration: 60_000 }]) {
    const url = await sbx.downloadUrl('down.txt', opts)
    assert.ok(url.startsWith(proxy.origin + '/files?') && url.includes('signature='), url)
    const res = await fetch(url)
    assert.equal(res.status, 200, await res.clone().text())
    assert.equal(await res.text(), 'downloaded')
  }
})

await check('uploadUrl: a multipart POST to the signed URL, fetched as it is', async () => {
  const form = new FormData()
  form.append('file', new Blob(['uploaded']), 'up.txt')
  const res = await fetch(await sbx.uploadUrl('up.txt'), { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.text())
  assert.equal(await sbx.files.read('up.txt'), 'uploaded')
})

await check('getHost: a server in the sandbox answers Node fetch and curl by its host name', async () => {
  await sbx.files.write('/tmp/www/index.html', 'hello from the sandbox')
  await sbx.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.sbx.localhost`)
  // The name resolves to loopback; the port is the proxy listener's.
  const url = `http://${host}:${proxy.port}/index.html`
  const body = await until(100, async () => {
    const res = await fetch(url)
    return res.status === 200 ? res.text() : undefined
  })
  assert.equal(body, 'hello from the sandbox')
  assert.equal(execFileSync('curl', ['-sSf', url], { encoding: 'utf8' }), 'hello from the sandbox')
})

await check('pty: after a reconnect, typed commands print their output', async () => {
  const dec = new TextDecoder()
  let first = ''
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { first += dec.decode(d, { stream: true }) } })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo one$((40+1))\n'))
  await until(100, async () => (first.includes('one41') ? true : undefined))
  await h.disconnect()
  let second = ''
  const again = await sbx.pty.connect(h.pid, { onData: (d) => { second += dec.decode(d, { stream: true }) } })
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo two$((40+2))\n'))
  await until(100, async () => (second.includes('two42') ? true : undefined))
    .catch(() => assert.fail(`after the reconnect the PTY delivered ${JSON.stringify(second)}`))
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode('exit\n'))
  await again.wait()
})

// typeAndSee types line into PTY pid and waits for want in what got()
// returns.
async function typeAndSee(box, pid, line, want, got) {
  await box.pty.sendInput(pid, new TextEncoder().encode(line + '\n'))
  await until(100, async () => (got().includes(want) ? true : undefined))
    .catch(() => assert.fail(`the PTY delivered ${JSON.stringify(got())}, not ${want}`))
}

await check('pause: a PTY reconnected after the resume prints output; a timer set before it runs out', async () => {
  const dec = new TextDecoder()
  let before = ''
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { before += dec.decode(d, { stream: true }) } })
  await typeAndSee(sbx, h.pid, 'echo pre$((40+3))', 'pre43', () => before)
  await sbx.commands.run('rm -f /tmp/slept; (sleep 4 && touch /tmp/slept) >/dev/null 2>&1 &')
  await sbx.pause()
  const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
  const resumed = Date.now()
  let after = ''
  await back.pty.connect(h.pid, { onData: (d) => { after += dec.decode(d, { stream: true }) } })
  await typeAndSee(back, h.pid, 'echo post$((40+4))', 'post44', () => after)
  await new Promise((r) => setTimeout(r, Math.max(0, 4_500 - (Date.now() - resumed))))
  const r = await back.commands.run('test -e /tmp/slept && echo done || { date; cat /proc/uptime; echo missing; }')
  assert.equal(r.stdout, 'done\n', r.stdout)
})

await check('Template builder: fromTemplate(base).copy(...) uploads the files; a sandbox of it has them', async () => {
  const ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-tpl-'))
  fs.writeFileSync(path.join(ctx, 'hello.txt'), 'copied by the template builder\n')
  const tpl = Template({ fileContextPath: ctx }).fromTemplate('base').copy('hello.txt', '/home/user/hello.txt')
  const name = `copy-${process.pid}-${Date.now()}`
  await Template.build(tpl, name, { cpuCount: 1, memoryMB: 512 }).catch((e) => assert.fail(`Template.build: ${e.message}`))
  const s = await Sandbox.create(name, { timeoutMs: 120_000 })
  try {
    assert.equal(await s.files.read('/home/user/hello.txt'), 'copied by the template builder\n')
  } finally {
    await s.kill()
    fs.rmSync(ctx, { recursive: true, force: true })
  }
})

await sbx.kill()
finish('userpaths scenario passed')
