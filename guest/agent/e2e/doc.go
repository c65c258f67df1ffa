// Package e2e runs E2B's own npm SDK (installed by .ci/setup.d/30-e2b-sdk.sh
// into sdk-<version>/) against a real aenv-agent process on localhost:49983,
// the address the SDK's debug mode uses. The scenario lives in scenario.mjs.
package e2e
