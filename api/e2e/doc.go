// Package e2e runs aenvd as a real process with real QEMU VMs and drives it
// through its HTTP API: Go negative tests of the control API, and E2B's own
// npm SDK (installed by .ci/setup.d/30-e2b-sdk.sh into
// guest/agent/e2e/sdk-<version>) pointed at aenvd with E2B_API_URL and
// E2B_SANDBOX_URL. One aenvd (one template build) serves every test of the
// package; sandboxes are created by restoring the template snapshot.
package e2e
