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

// Steps run by check go on after a failure (a scenario that reports every
// broken call at once); finish ends such a script: non-zero, with the count,
// when any failed, else it prints passed.
let failures = 0
export async function check(name, fn) {
  const t0 = Date.now()
  try {
    await fn()
    console.log(`ok ${name} (${Date.now() - t0} ms)`)
  } catch (err) {
    failures++
    console.error(`FAIL ${name}:`, err)
  }
}

//
// It exits at once rather than letting Node wait for the event loop to
// drain: an SDK call can leave a timer armed after it returned (a runCode's
// request timeout, minutes long), which would keep a finished script, and
// the test waiting on it, alive until the timer fires.
export function finish(passed) {
  if (failures > 0) {
    console.error(`${failures} step(s) failed`)
    process.exit(1)
  }
  console.log(passed)
  process.exit(0)
}
