// What users of E2B's base image rely on, checked through E2B's SDK in a
// sandbox of the `base` template: the user `user` with its home and
// passwordless sudo, git, Node.js with npm, python3 with pip and venv, a C
// and C++ toolchain, free disk space, and git operations through sbx.git.
// Run by api/e2e's Go test (baseimage_test.go):
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... AENV_E2B_SDK_DIR=<sdk-x.y.z dir> [AENV_BASEIMAGE_TOOLS=1] node baseimage.mjs
// The tools (git, node, npm, pip, venv, gcc) are the template's, whatever the
// SDK version, and slow under TCG: AENV_BASEIMAGE_TOOLS=1 checks them (the Go
// test sets it for one SDK version); the user, disk and sbx.git steps run
// always.
// Prints "ok <step>" per step; exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step } from '../../internal/testutil/e2bscript/steps.mjs'

const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'))
const { Sandbox } = require('e2b')
const sdkVersion = require('e2b/package.json').version
// The least free space on / a fresh sandbox must leave its user.
const minFreeMiB = 2048
const tools = process.env.AENV_BASEIMAGE_TOOLS === '1'

// run runs cmd as the default user and returns its stdout; a non-zero exit
// fails the step with the command's output.
async function run(sbx, cmd, opts = {}) {
  try {
    const r = await sbx.commands.run(cmd, { timeoutMs: 120_000, ...opts })
    return r.stdout
  } catch (err) {
    throw new Error(`${cmd}: ${err.message}\nstdout: ${err.stdout ?? ''}\nstderr: ${err.stderr ?? ''}`)
  }
}

console.log(`e2b SDK ${sdkVersion}`)
let sbx
await step('create a sandbox of the base template', async () => {
  sbx = await Sandbox.create('base', { metadata: { suite: 'aenvd-e2e-baseimage' }, timeoutMs: 600_000 })
})

try {
  await step('the default user is user with home /home/user', async () => {
    assert.equal(await run(sbx, 'whoami; echo "$HOME"; pwd; id -u'), 'user\n/home/user\n/home/user\n1000\n')
  })

  await step('passwordless sudo', async () => {
    assert.equal(await run(sbx, 'sudo -n id -un'), 'root\n')
  })

  if (tools) {
    await step('procps and curl', async () => {
      assert.match(await run(sbx, 'ps -o comm= -p $$; curl --version'), /^(ba)?sh\ncurl \d+\./)
    })

    await step('git, node, npm, pip, gcc, g++ and make answer their version', async () => {
      const checks = [
        ['git --version', /^git version 2\.\d+/],
        ['node --version', /^v\d+\.\d+\.\d+\n$/],
        ['npm --version', /^\d+\.\d+\.\d+\n$/],
        ['python3 --version', /^Python 3\.\d+/],
        ['python3 -m pip --version', /^pip \d+/],
        ['gcc --version', /^gcc .* \d+\.\d+/],
        ['g++ --version', /^g\+\+ .* \d+\.\d+/],
        ['make --version', /^GNU Make \d+/],
      ]
      for (const [cmd, want] of checks) {
        assert.match(await run(sbx, cmd), want, cmd)
      }
    })

    await step('gcc builds and runs a C program', async () => {
      await sbx.files.write('hello.c', '#include <stdio.h>\nint main(void) { puts("built here"); return 0; }\n')
      assert.equal(await run(sbx, 'gcc -O1 -o hello hello.c && ./hello'), 'built here\n')
    })

    await step('node runs a script and npm initialises a package', async () => {
      assert.equal(await run(sbx, "node -e 'console.log(6 * 7)'"), '42\n')
      await run(sbx, 'mkdir -p pkg && cd pkg && npm init -y >/dev/null')
      assert.equal(JSON.parse(await sbx.files.read('pkg/package.json')).name, 'pkg')
    })

    await step('python3 -m venv makes an environment with pip', async () => {
      const out = await run(sbx, 'python3 -m venv venv && venv/bin/python -m pip --version')
      assert.match(out, /^pip \d+.* from \/home\/user\/venv\//)
    })

    await step('pip installs a package for the user (no externally-managed refusal)', async () => {
      await sbx.files.write('mini/setup.py', "from setuptools import setup\nsetup(name='aenvmini', version='1.0', py_modules=['aenvmini'])\n")
      await sbx.files.write('mini/aenvmini.py', 'ANSWER = 42\n')
      await run(sbx, 'python3 -m pip install -q --no-index --no-build-isolation ./mini')
      const out = await run(sbx, 'cd / && python3 -c "import aenvmini; print(aenvmini.ANSWER, aenvmini.__file__)"')
      assert.match(out, /^42 \/home\/user\/\.local\/lib\/python3\.\d+\/site-packages\/aenvmini\.py\n$/)
    })
  } else {
    console.log('skip the tools (checked with another SDK version)')
  }

  await step(`the root filesystem leaves at least ${minFreeMiB} MiB free`, async () => {
    const [, avail] = (await run(sbx, 'df -Pm / | tail -n 1')).trim().split(/\s+/).slice(2)
    assert.ok(Number(avail) >= minFreeMiB, `df -Pm / says ${avail} MiB available`)
  })

  await step('sbx.git: configure the user, init, add, commit, status', async () => {
    await sbx.git.configureUser('Sandbox User', 'user@sandbox.test')
    assert.equal(await sbx.git.getConfig('user.email', { scope: 'global' }), 'user@sandbox.test')
    await sbx.git.init('/home/user/origin', { initialBranch: 'main' })
    await sbx.files.write('/home/user/origin/README.md', 'first\n')
    let st = await sbx.git.status('/home/user/origin')
    assert.equal(st.untrackedCount, 1)
    await sbx.git.add('/home/user/origin')
    await sbx.git.commit('/home/user/origin', 'first commit')
    st = await sbx.git.status('/home/user/origin')
    assert.equal(st.isClean, true)
    assert.equal(st.currentBranch, 'main')
    assert.equal(await run(sbx, 'git -C origin log --format=%an:%s'), 'Sandbox User:first commit\n')
  })

  await step('sbx.git: clone a local repository, branch, commit with an author, ahead of origin', async () => {
    await sbx.git.clone('/home/user/origin', { path: '/home/user/clone' })
    assert.equal(await sbx.files.read('/home/user/clone/README.md'), 'first\n')
    assert.equal(await sbx.git.remoteGet('/home/user/clone', 'origin'), '/home/user/origin')
    await sbx.git.createBranch('/home/user/clone', 'feature')
    await sbx.files.write('/home/user/clone/feature.txt', 'feature\n')
    await sbx.git.add('/home/user/clone', { files: ['feature.txt'] })
    await sbx.git.commit('/home/user/clone', 'add a feature', { authorName: 'Other', authorEmail: 'other@sandbox.test' })
    const br = await sbx.git.branches('/home/user/clone')
    assert.equal(br.currentBranch, 'feature')
    assert.deepEqual([...br.branches].sort(), ['feature', 'main'])
    await sbx.git.checkoutBranch('/home/user/clone', 'main')
    await run(sbx, 'git -C clone merge -q --ff-only feature')
    const st = await sbx.git.status('/home/user/clone')
    assert.equal(st.upstream, 'origin/main')
    assert.equal(st.ahead, 1)
    assert.equal(await run(sbx, 'git -C clone log -1 --format=%an:%s'), 'Other:add a feature\n')
  })
} finally {
  await sbx.kill()
}
console.log('baseimage scenario passed')
