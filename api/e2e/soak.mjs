// The restore soak, driven through E2B's SDK (run by api/e2e's TestSDKRestoreSoak):
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_E2B_SDK_DIR=<sdk-x.y.z dir> \
//   AENV_SOAK_RESTORES=<n> node soak.mjs
// One sandbox is seeded with random bytes made here (8 MiB in tmpfs, that is
// guest memory, and 4 MiB in a synced file on its disk), then restored n
// times: a pause and a connect, or (every third restore) a fork: a snapshot
// of the sandbox and a new sandbox created from it, killed with its
// snapshot once checked (the sandbox itself runs on: a sandbox created from
// a snapshot holds that snapshot's files, so a chain of forks would keep
// every snapshot of it). After each restore the guest sums the seed (its
// page cache dropped first, so the file is read from the disk), the fresh
// memory the sandbox's restore before wrote and a background loop's
// progress; the sums must equal the ones computed here. Then 4 MiB of new
// random bytes go into its memory, read back at once and again by the next
// restore.
//
// After each checked restore the script prints "restored <i> <kind> <id>
// <ms>" (the restore and its checks took ms milliseconds)
// and waits for a line on stdin: "next" once the test has scanned that
// sandbox's kernel log and console for crashes, anything else (or the end of
// stdin) to stop. It prints "soak <n> restores" and "soak scenario passed"
// at its end; the first wrong byte prints FAIL and exits non-zero.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { createHash, randomBytes } from 'node:crypto'
import path from 'node:path'
import readline from 'node:readline'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
const sdkVersion = require('e2b/package.json').version
const restores = Number(process.env.AENV_SOAK_RESTORES || '18')
const tag = `soak-${process.pid}-${Date.now()}`
const sha = (b) => createHash('sha256').update(b).digest('hex')
const root = { user: 'root', timeoutMs: 120_000 }
const opts = { metadata: { suite: 'aenvd-e2e', tag }, timeoutMs: 3_600_000 }

const replies = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()

console.log(`e2b SDK ${sdkVersion}`)
if (typeof Sandbox.prototype.createSnapshot !== 'function') {
  throw new Error(`E2B SDK ${sdkVersion} has no createSnapshot: the soak's fork step needs 2.51 or later`)
}

// The seed, made here so that its sums are the host's, not the guest's.
const shmSeed = randomBytes(8 << 20)
const diskSeed = randomBytes(4 << 20)
const want = { shm: sha(shmSeed), disk: sha(diskSeed) }

let sbx = await Sandbox.create('base', opts)
await sbx.files.write('/dev/shm/soak-seed', shmSeed)
await sbx.files.write('/home/user/soak-seed', diskSeed)
await sbx.commands.run('sync', root)
// A loop kept running, so that every pause and snapshot catches the guest busy.
await sbx.commands.run(`setsid nohup bash -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/soak-loop.new; ` +
  `mv /dev/shm/soak-loop.new /dev/shm/soak-loop; sleep 0.1; done' >/dev/null 2>&1 < /dev/null & disown; ` +
  `for i in $(seq 50); do [ -s /dev/shm/soak-loop ] && break; sleep 0.1; done`, root)
let fresh = null // the sum of the memory the sandbox's last restore wrote

// check sums what a restored sandbox holds, writes fresh memory into it and
// sums that too; every difference from the sums made here fails the script.
// It returns the new memory's sum.
async function check(box, i) {
  const files = ['/dev/shm/soak-seed', '/home/user/soak-seed'].concat(fresh ? ['/dev/shm/soak-fresh'] : [])
  const r = await box.commands.run(`sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum ${files.join(' ')} | cut -d' ' -f1; ` +
    // The loop must count on: waited for up to 30 s (a loaded host slows
    // the guest's every fork and sleep), a loop that stopped never does.
    `a=$(cat /dev/shm/soak-loop); for t in $(seq 300); do sleep 0.1; b=$(cat /dev/shm/soak-loop); ` +
    `if [ "$b" -gt "$a" ]; then echo loop-runs; break; fi; done`, root)
  const got = r.stdout.trim().split('\n')
  assert.equal(got[0], want.shm, `restore ${i}: the 8 MiB seed in guest memory sums differently`)
  assert.equal(got[1], want.disk, `restore ${i}: the seed file on disk sums differently`)
  if (fresh) assert.equal(got[2], fresh, `restore ${i}: the memory written after the restore before sums differently`)
  assert.equal(got[got.length - 1], 'loop-runs', `restore ${i}: the background loop no longer runs`)
  const next = randomBytes(4 << 20)
  await box.files.write('/dev/shm/soak-fresh', next)
  const back = await box.commands.run('sha256sum /dev/shm/soak-fresh | cut -d" " -f1', root)
  assert.equal(back.stdout.trim(), sha(next), `restore ${i}: the memory written after it reads back differently`)
  return sha(next)
}

// scanned reports restore i of box to the test and waits for its scan of
// the guest: false when the test says stop.
async function scanned(i, kind, box, t0) {
  console.log(`restored ${i} ${kind} ${box.sandboxId} ${Date.now() - t0}`)
  const { value, done } = await replies.next()
  return !done && value === 'next'
}

// restore does restore i: every third a fork (a snapshot of the sandbox and
// a sandbox created from it, checked, scanned and killed with its
// snapshot; the sandbox itself runs on), else a pause and a connect.
async function restore(i) {
  const t0 = Date.now()
  if (i % 3 !== 0) {
    assert.equal(await sbx.pause(), true, `restore ${i}: pause`)
    sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: opts.timeoutMs })
    fresh = await check(sbx, i)
    return scanned(i, 'resume', sbx, t0)
  }
  const snap = await sbx.createSnapshot()
  const child = await Sandbox.create(snap.snapshotId, opts)
  await check(child, i) // the child's own fresh memory is read back at once
  const goOn = await scanned(i, 'fork', child, t0)
  await child.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true, `restore ${i}: delete snapshot ${snap.snapshotId}`)
  return goOn
}

let done = 0
try {
  fresh = await check(sbx, 0)
  for (let i = 1; i <= restores; i++) {
    const goOn = await restore(i)
    done = i
    if (!goOn) break
  }
} catch (err) {
  console.error(`FAIL after ${done} restores:`, err)
  process.exit(1)
}
await sbx.kill()
console.log(`soak ${done} restores`)
if (done === restores) console.log('soak scenario passed')
process.exit(0)
