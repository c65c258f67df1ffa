// After a crash of the node: checks through E2B's SDK that a sandbox is
// listed, resumes (Sandbox.connect), and holds every data set written before
// the crash once the guest's page cache is dropped, and that the guest's
// ext4 reported no error. Run by api/e2e's crash matrix:
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_E2B_SDK_DIR=<sdk dir> \
//   AENV_CHECK_ID=<sandbox id> AENV_CHECK_SETS='[{"tag":"p","sums":"<sha256sum output>"}]' node crashcheck.mjs
// Prints "crash check passed" or exits non-zero with what differs.
import { createRequire } from 'node:module'
import path from 'node:path'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
const id = process.env.AENV_CHECK_ID
const sets = JSON.parse(process.env.AENV_CHECK_SETS || '[]')

function fail(msg) {
  console.error(`FAIL ${msg}`)
  process.exit(1)
}

const pager = Sandbox.list({ query: { state: ['running', 'paused'] } })
const listed = []
while (pager.hasNext) listed.push(...(await pager.nextItems()))
if (!listed.some((s) => s.sandboxId === id)) fail(`sandbox ${id} is not listed after the crash`)

const sbx = await Sandbox.connect(id, { timeoutMs: 120_000 })
const root = { user: 'root', timeoutMs: 120_000 }
await sbx.commands.run('sync; echo 3 > /proc/sys/vm/drop_caches', root)
for (const set of sets) {
  const r = await sbx.commands.run(`cd /home/user/${set.tag} && sha256sum big small-*`, root)
  if (r.stdout.trim() !== set.sums) fail(`data set ${set.tag} reads back as\n${r.stdout}\nwant\n${set.sums}`)
}
const ext4 = await sbx.commands.run(`dmesg | grep -c 'EXT4-fs error' || true`, root)
if (ext4.stdout.trim() !== '0') fail(`the guest's ext4 reported ${ext4.stdout.trim()} errors`)
console.log(`crash check passed (${sets.length} data sets)`)
