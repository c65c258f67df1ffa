// E2B SDK scenario against aenvd (control API + sandbox proxy). Run by api/e2e's Go test:
//   E2B_API_URL=http://127.0.0.1:<api> E2B_SANDBOX_URL=http://127.0.0.1:<proxy> E2B_API_KEY=e2b_... \
//   AENV_E2B_SDK_DIR=<sdk-x.y.z dir> AENV_CONCURRENT=<n> node scenario.mjs
// Prints "ok <step>" per step; exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../internal/testutil/e2bscript/steps.mjs'
import http from 'node:http'
import https from 'node:https'
import fs from 'node:fs'
import { createHash } from 'node:crypto'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox, Template, TimeoutError } = require('e2b')
const sdkVersion = require('e2b/package.json').version
const concurrent = Number(process.env.AENV_CONCURRENT || '0')
const tag = `run-${process.pid}-${Date.now()}`

async function listAll(query, limit, order) {
  const pager = Sandbox.list({ query, limit, order })
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

await step('files metadata: answered by write, replaced by an overwrite, cleared by one without', async () => {
  const meta = { purpose: 'aenvd-e2e', owner: 'sdk' }
  const w1 = await sbx.files.write('meta.txt', 'one', { metadata: meta })
  assert.deepEqual(w1.metadata, meta)
  assert.deepEqual((await sbx.files.getInfo('meta.txt')).metadata, meta)
  const w2 = await sbx.files.write('meta.txt', 'two', { metadata: { purpose: 'again' } })
  assert.deepEqual(w2.metadata, { purpose: 'again' })
  assert.deepEqual((await sbx.files.getInfo('meta.txt')).metadata, { purpose: 'again' }, 'an overwrite replaces the metadata')
  const w3 = await sbx.files.write('meta.txt', 'three')
  assert.equal(w3.metadata, undefined)
  assert.equal((await sbx.files.getInfo('meta.txt')).metadata, undefined, 'an overwrite without metadata clears it')
  assert.equal(await sbx.files.read('meta.txt'), 'three')
})

await step('files remove of a missing path succeeds', async () => {
  await sbx.files.remove(`no-such-dir-${tag}/no-such-file`)
  await sbx.files.remove('meta.txt')
  await sbx.files.remove('meta.txt')
  assert.equal(await sbx.files.exists('meta.txt'), false)
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

// sdkAtLeast compares the SDK's version with a dotted one.
function sdkAtLeast(v) {
  const a = sdkVersion.split('.').map(Number)
  const b = v.split('.').map(Number)
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] > b[i]
  return true
}

const bootID = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
const hasSleeper = async (s) => (await s.commands.list()).some((p) => JSON.stringify(p).includes('sleep 901'))

await step('pause({ keepMemory: false }): connect cold-boots with the files kept, processes gone', async () => {
  const c = await Sandbox.create('base', { metadata: { suite: 'aenvd-e2e', tag: `${tag}-cold` }, timeoutMs: 120_000 })
  try {
    const boot0 = await bootID(c)
    await c.files.write('cold.txt', 'kept across a cold boot\n')
    const h = await c.commands.run('sleep 901', { background: true })
    await h.disconnect()
    assert.equal(await c.pause({ keepMemory: false }), true)
    const back = await Sandbox.connect(c.sandboxId, { timeoutMs: 120_000 })
    const boot1 = await bootID(back)
    assert.notEqual(boot1, boot0, 'a filesystem-only pause resumes with a new boot')
    assert.equal(await back.files.read('cold.txt'), 'kept across a cold boot\n')
    assert.equal(await hasSleeper(back), false, 'no process survives a filesystem-only pause')
    if (sdkAtLeast('2.50.0')) {
      // onResume 'reboot' (memory false) cold-boots a memory pause too.
      const h2 = await back.commands.run('sleep 901', { background: true })
      await h2.disconnect()
      assert.equal(await back.pause(), true)
      const rebooted = await Sandbox.connect(c.sandboxId, { timeoutMs: 120_000, onResume: 'reboot' })
      assert.notEqual(await bootID(rebooted), boot1, "onResume 'reboot' boots anew")
      assert.equal(await hasSleeper(rebooted), false)
      assert.equal(await rebooted.files.read('cold.txt'), 'kept across a cold boot\n')
    }
  } finally {
    await Sandbox.kill(c.sandboxId)
  }
})

await step("lifecycle onTimeout { action: 'pause', keepMemory: false }: the auto-pause is filesystem-only", async () => {
  const c = await Sandbox.create('base', { metadata: { suite: 'aenvd-e2e', tag: `${tag}-autocold` }, timeoutMs: 120_000,
    lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  try {
    const boot0 = await bootID(c)
    await c.setTimeout(1_000) // the timeout runs out now, after the boot id was read
    let info
    for (let i = 0; i < 120; i++) {
      info = await Sandbox.getInfo(c.sandboxId)
      if (info.state === 'paused') break
      await new Promise((r) => setTimeout(r, 1000))
    }
    assert.equal(info.state, 'paused', 'auto-paused at its timeout')
    const back = await Sandbox.connect(c.sandboxId, { timeoutMs: 120_000 })
    assert.notEqual(await bootID(back), boot0, 'the filesystem-only auto-pause resumes with a new boot')
  } finally {
    await Sandbox.kill(c.sandboxId)
  }
})

await step('metrics: the history by range, several sandboxes at once', async () => {
  // The node samples every few seconds: wait for three samples.
  let ms = []
  for (let i = 0; i < 40 && ms.length < 3; i++) {
    ms = await again.getMetrics()
    if (ms.length < 3) await new Promise((r) => setTimeout(r, 1000))
  }
  assert.ok(ms.length >= 3, `${ms.length} samples after waiting`)
  const secs = (m) => Math.round(m.timestamp.getTime() / 1000)
  for (let i = 1; i < ms.length; i++) assert.ok(secs(ms[i]) > secs(ms[i - 1]), 'samples are oldest first')
  for (const m of ms) assert.ok(m.cpuCount >= 1 && m.memTotal > 0 && m.memUsed > 0 && m.diskTotal > 0, JSON.stringify(m))
  const start = ms[1].timestamp
  const end = ms[ms.length - 2].timestamp
  const sub = await again.getMetrics({ start, end })
  assert.deepEqual(sub.map(secs), ms.slice(1, ms.length - 1).map(secs), 'getMetrics({start, end}) answers the range')
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes/metrics?sandbox_ids=${again.sandboxId},nosuch${tag}`,
    { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
  assert.equal(res.status, 200)
  const many = await res.json()
  assert.deepEqual(Object.keys(many.sandboxes), [again.sandboxId])
  assert.ok(many.sandboxes[again.sandboxId].timestampUnix >= secs(ms[ms.length - 1]), 'the newest sample')
})

await step('logs: the agent\'s recent lines', async () => {
  const t0 = Date.now() - 60_000 // the guest clock is set at /init, to about a second
  await again.commands.run('true')
  const res = await fetch(`${process.env.E2B_API_URL}/sandboxes/${again.sandboxId}/logs?start=${t0}`,
    { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
  assert.equal(res.status, 200)
  const logs = await res.json()
  const started = logs.logEntries.filter((e) => e.message === 'process started' && e.fields.cmd === 'bash')
  assert.ok(started.length >= 1, `no "process started" entry since ${t0}: ${JSON.stringify(logs).slice(0, 2000)}`)
  assert.ok(logs.logs.some((l) => l.line.includes('msg="process started"')))
  for (const e of logs.logEntries) assert.ok(new Date(e.timestamp).getTime() >= t0, 'start filters by time')
})

await step('template tags: Template.assignTags, getTags, removeTags', async () => {
  const tagName = `t${process.pid}${sdkVersion.replaceAll('.', '')}`
  const assigned = await Template.assignTags('base', [tagName])
  assert.deepEqual(assigned.tags, [tagName])
  assert.ok(assigned.buildId)
  const listed = await Template.getTags('base')
  const mine = listed.find((t) => t.tag === tagName)
  assert.ok(mine && mine.buildId === assigned.buildId && mine.createdAt instanceof Date, JSON.stringify(listed))
  await Template.removeTags('base', [tagName])
  assert.ok(!(await Template.getTags('base')).some((t) => t.tag === tagName), 'a removed tag is not listed')
  await assert.rejects(Template.removeTags('base', [tagName]), 'removing a missing tag fails')
})

await step('host routing over TLS: the SDK\'s sbx.getHost(port) URL, trusting the node\'s CA', async () => {
  const host = again.getHost(49983)
  assert.match(host, new RegExp(`^49983-${again.sandboxId}\\.`))
  const [ip, port] = process.env.AENV_TLS_PROXY.split(':')
  const ca = fs.readFileSync(process.env.AENV_TLS_CA)
  // The name resolves to the node's loopback address, as DNS would for
  // a wildcard record; TLS verifies it against the certificate.
  const lookup = (name, opts, cb) => (opts.all ? cb(null, [{ address: ip, family: 4 }]) : cb(null, ip, 4))
  const res = await new Promise((resolve, reject) => {
    const req = https.request({ host, port: Number(port), path: '/health', ca, lookup }, (r) => {
      r.resume()
      r.on('end', () => resolve(r))
    })
    req.on('error', reject)
    req.end()
  })
  assert.ok(res.statusCode === 200 || res.statusCode === 204, `GET https://${host}/health: ${res.statusCode}`)
  await assert.rejects(new Promise((resolve, reject) => {
    https.request({ host, port: Number(port), path: '/health', lookup }, resolve).on('error', reject).end()
  }), /certificate/, 'without the CA the certificate is not trusted')
})

await step('snapshot: listed, deleted by Sandbox.deleteSnapshot, then not found', async () => {
  const snap = await again.createSnapshot()
  const listedIds = async () => {
    const pager = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId })
    const out = []
    while (pager.hasNext) out.push(...(await pager.nextItems()))
    return out.map((s) => s.snapshotId)
  }
  assert.ok((await listedIds()).includes(snap.snapshotId), 'the new snapshot is listed')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.ok(!(await listedIds()).includes(snap.snapshotId), 'a deleted snapshot is not listed')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'a second delete reports not found')
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
    await listOrderAndFilters(ctag, items)
    await Promise.all(boxes.map((b) => b.kill()))
  })
}

// listOrderAndFilters checks Sandbox.list's order, startedAfter and
// template (every SDK version in use has them) on the sandboxes tagged ctag.
async function listOrderAndFilters(ctag, items) {
  const query = { metadata: { tag: ctag } }
  const ids = (xs) => xs.map((s) => s.sandboxId)
  const times = (xs) => xs.map((s) => s.startedAt.getTime())
  const asc = (await listAll(query, undefined, 'asc')).items
  const desc = (await listAll(query, undefined, 'desc')).items
  assert.deepEqual(ids(desc), ids((await listAll(query)).items), 'desc is the default order')
  assert.deepEqual(new Set(ids(asc)), new Set(ids(items)))
  assert.deepEqual(times(asc), [...times(asc)].sort((a, b) => a - b), 'order asc: oldest first')
  assert.deepEqual(times(desc), [...times(desc)].sort((a, b) => b - a), 'order desc: newest first')
  const paged = await listAll(query, 2, 'asc')
  assert.deepEqual(ids(paged.items), ids(asc), 'the order holds across pages')
  assert.equal(paged.pages, Math.ceil(asc.length / 2))

  // The SDK's times have milliseconds, the server's nanoseconds: a sandbox
  // started in mid's millisecond is at or after mid on both sides.
  const mid = (asc.find((s) => s.startedAt > asc[0].startedAt) ?? asc[asc.length - 1]).startedAt
  const after = (await listAll({ ...query, startedAfter: mid }, undefined, 'asc')).items
  assert.deepEqual(ids(after), ids(asc.filter((s) => s.startedAt >= mid)), `startedAfter ${mid.toISOString()}`)
  assert.ok(after.length >= 1)
  if (mid > asc[0].startedAt) assert.ok(after.length < asc.length, 'startedAfter left out the older sandboxes')
  assert.equal((await listAll({ ...query, startedAfter: new Date(Date.now() + 3_600_000) })).items.length, 0)

  const tpl = asc[0].templateId
  assert.deepEqual(new Set(ids((await listAll({ ...query, template: tpl })).items)), new Set(ids(asc)), `template ${tpl}`)
  assert.deepEqual(new Set(ids((await listAll({ ...query, template: 'base' })).items)), new Set(ids(asc)), 'template by name')
  assert.equal((await listAll({ ...query, template: `no-such-template-${tag}` })).items.length, 0)
}

// viaProxy fetches a sandbox's port through E2B_SANDBOX_URL, named by the
// routing headers the SDK itself sends there.
function viaProxy(id, port, pathAndQuery) {
  const u = new URL(pathAndQuery, process.env.E2B_SANDBOX_URL)
  return fetch(u, { headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': String(port) } })
}

await step('proxy answers as E2B: maskRequestHost, expired signed URL, killed sandbox', async () => {
  const p = await Sandbox.create('base', { secure: true, network: { maskRequestHost: 'app.internal:${PORT}' }, timeoutMs: 120_000 })
  assert.equal((await p.getInfo()).network?.maskRequestHost, 'app.internal:${PORT}')
  const srv = 'from http.server import BaseHTTPRequestHandler, HTTPServer\n' +
    'class H(BaseHTTPRequestHandler):\n' +
    '    def do_GET(self):\n' +
    '        b = self.headers["Host"].encode()\n' +
    '        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)\n' +
    'HTTPServer(("0.0.0.0", 8001), H).serve_forever()\n'
  await p.files.write('/tmp/host.py', srv)
  await p.commands.run('python3 /tmp/host.py', { background: true })
  let host
  for (let i = 0; i < 50 && host === undefined; i++) {
    const res = await viaProxy(p.sandboxId, 8001, '/')
    if (res.status === 200) host = await res.text()
    else await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(host, 'app.internal:8001', 'the guest sees the masked Host')

  await p.files.write('signed.txt', 'signed')
  const expired = new URL(await p.downloadUrl('signed.txt', { useSignatureExpiration: -10_000 }))
  const res = await viaProxy(p.sandboxId, 49983, expired.pathname + expired.search)
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'signature is already expired' })
  const valid = new URL(await p.downloadUrl('signed.txt', { useSignatureExpiration: 60_000 }))
  assert.equal(await (await viaProxy(p.sandboxId, 49983, valid.pathname + valid.search)).text(), 'signed')

  await p.kill()
  await assert.rejects(p.files.read('signed.txt'),
    (e) => e instanceof TimeoutError && e.message.startsWith('The sandbox was not found:'), 'the SDK error of a killed sandbox')
  const gone = await viaProxy(p.sandboxId, 49983, '/health')
  assert.equal(gone.status, 502)
  assert.deepEqual(await gone.json(), { sandboxId: p.sandboxId, message: 'The sandbox was not found', code: 502 })
  assert.equal(await p.isRunning(), false)
})

await step('kill while a command streams ends cmd.wait() at once with the SDK error', async () => {
  const k = await Sandbox.create('base', { timeoutMs: 120_000 })
  let out = ''
  let started
  const seen = new Promise((r) => { started = r })
  // No command timeout: only the kill can end this wait.
  const h = await k.commands.run('echo started; exec sleep 900', {
    background: true, timeoutMs: 0, onStdout: (d) => { out += d; if (out.includes('started')) started() },
  })
  await seen
  const waited = h.wait().then(() => 'resolved', (e) => e)
  assert.equal(await Sandbox.kill(k.sandboxId), true)
  const res = await waited
  assert.ok(res instanceof TimeoutError, `cmd.wait() after a kill: ${res}`)
  assert.match(res.message, /killed or reached its end of life/)
})

await step('lifecycle webhooks: created, paused, resumed, killed, signed as E2B signs', async () => {
  const got = []
  const receiver = http.createServer((req, res) => {
    let body = ''
    req.on('data', (c) => { body += c })
    req.on('end', () => { got.push({ headers: req.headers, body }); res.writeHead(204).end() })
  })
  await new Promise((r) => receiver.listen(0, '127.0.0.1', r))
  const api = (method, p, body) => fetch(`${process.env.E2B_API_URL}${p}`, {
    method, headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: body && JSON.stringify(body),
  })
  const secret = `secret-${tag}`
  const events = ['sandbox.lifecycle.created', 'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.killed']
  const reg = await api('POST', '/events/webhooks', { name: `hook-${tag}`, url: `http://127.0.0.1:${receiver.address().port}/hook`, enabled: true, events, signatureSecret: secret })
  assert.equal(reg.status, 201)
  const hook = await reg.json()
  try {
    const w = await Sandbox.create('base', { metadata: { tag: `${tag}-hook` }, timeoutMs: 120_000 })
    await w.pause()
    const back = await Sandbox.connect(w.sandboxId, { timeoutMs: 120_000 })
    await back.kill()
    const mine = () => got.map((g) => ({ ...g, json: JSON.parse(g.body) })).filter((g) => g.json.sandboxId === w.sandboxId)
    for (let i = 0; i < 300 && mine().length < 4; i++) await new Promise((r) => setTimeout(r, 100))
    const seen = mine()
    assert.deepEqual(seen.map((g) => g.json.type), events, 'the events in order')
    for (const g of seen) {
      const sig = createHash('sha256').update(secret + g.body).digest('base64').replace(/=+$/, '')
      assert.equal(g.headers['e2b-signature'], sig, 'e2b-signature verifies')
      assert.equal(g.headers['e2b-webhook-id'], hook.id)
      assert.equal(g.headers['e2b-signature-version'], 'v1')
      assert.equal(g.json.eventData.sandbox_metadata.tag, `${tag}-hook`)
    }
    const killed = seen[3].json
    assert.ok(killed.eventData.execution.vcpu_count >= 1 && killed.eventData.execution.memory_mb > 0, JSON.stringify(killed))
  } finally {
    assert.equal((await api('DELETE', `/events/webhooks/${hook.id}`)).status, 204)
    receiver.close()
  }
})

await step('kill; gone from list; second kill reports false', async () => {
  assert.equal(await again.kill(), true)
  const { items } = await listAll({ metadata: { tag } })
  assert.equal(items.length, 0)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})

console.log('scenario passed')
