// Package e2e tests the web dashboard in a real browser: headless Chromium
// (Debian's chromium package, driven by playwright-core from npm) against
// a real aenvd with real VMs, through the pages a user clicks
// (dashboard/web/e2e/browser.mjs). Screenshots of each page are written to
// AENV_DASHBOARD_SHOTS (default: a temporary directory, named in the log).
package e2e
