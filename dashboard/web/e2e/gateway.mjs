// The sandboxes page through a cluster's gateway lists the sandboxes of
// every node; the overview's recent events, a sandbox's state history and
// the webhooks page are answered from every node. Run by cluster/e2e: AENV_URL (the gateway), AENV_API_KEY,
// AENV_IDS (comma-separated ids that must be listed), AENV_SHOTS.
import assert from 'node:assert/strict';
import path from 'node:path';
import { chromium } from 'playwright-core';

const ids = process.env.AENV_IDS.split(',').filter(Boolean);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
await context.addInitScript((k) => sessionStorage.setItem('aenv.apiKey', k), process.env.AENV_API_KEY);
const page = await context.newPage();
page.setDefaultTimeout(60_000);
await page.goto(`${process.env.AENV_URL}/dashboard/#/sandboxes`);
await page.locator('main table caption').waitFor();
const listed = await page.locator('main tbody a[href^="#/sandbox/"]').allTextContents();
for (const id of ids) assert.ok(listed.includes(id), `${id} is not listed: ${listed.join(' ')}`);
// Events merged from every node: the feed, and a sandbox's state history.
await page.evaluate(() => { location.hash = '#/overview'; });
await page.locator('#recent-events li[data-event]').first().waitFor();
await page.evaluate((id) => { location.hash = `#/sandbox/${id}`; }, ids[0]);
await page.locator('ol[aria-label="State history"] li[data-event=created]').waitFor();
// Webhooks: every node's listed; the page loads without an error.
await page.evaluate(() => { location.hash = '#/webhooks'; });
await page.locator('main table caption', { hasText: 'webhooks' }).waitFor();
assert.equal(await page.locator('main .status.error').count(), 0);
await page.evaluate(() => { location.hash = '#/nodes'; });
await page.locator('main table caption', { hasText: 'nodes' }).waitFor();
const nodes = await page.locator('main tbody tr').count();
if (process.env.AENV_SHOTS) await page.screenshot({ path: path.join(process.env.AENV_SHOTS, 'gateway-nodes.png'), fullPage: true });
await browser.close();
console.log(`listed ${listed.length} sandboxes (all ${ids.length} expected), ${nodes} nodes`);
console.log('gateway dashboard passed');
