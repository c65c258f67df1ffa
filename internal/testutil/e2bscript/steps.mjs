// The step runner of the E2B SDK scripts the end-to-end tests run (api/e2e,
// cluster/e2e, guest/agent/e2e import it by relative path): each step prints
// "ok <name> (<ms> ms)", and the first failure prints the error and ends the
// script with a non-zero exit (the Go test reads both).
export async function step(name, fn) {
  const t0 = Date.now()
  try {
    await fn()
    console.log(`ok ${name} (${Date.now() - t0} ms)`)
  } catch (err) {
    console.error(`FAIL ${name}:`, err)
    process.exit(1)
  }
}
