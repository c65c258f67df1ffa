// The quick start's client: E2B's own SDK, unchanged, pointed at aenvd.
import { Sandbox } from 'e2b'

const sbx = await Sandbox.create('base', { timeoutMs: 10 * 60 * 1000, metadata: { from: 'quickstart' } })
console.log(`sandbox ${sbx.sandboxId} is running`)
const r = await sbx.commands.run('uname -a; . /etc/os-release; echo "$PRETTY_NAME"; python3 --version; whoami')
process.stdout.write(r.stdout)
await sbx.files.write('hello.txt', 'hello from the host\n')
console.log('read back:', (await sbx.files.read('hello.txt')).trim())
console.log(`leaving it running: list it with  curl -s -H "X-API-Key: $E2B_API_KEY" $E2B_API_URL/sandboxes`)
