// The sandboxes page through a cluster's gateway lists the sandboxes of
// every node. Run by cluster/e2e: AENV_URL (the gateway), AENV_API_KEY,
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
await page.evaluate(() => { location.hash = '#/nodes'; });
await page.locator('main table caption', { hasText: 'nodes' }).waitFor();
const nodes = await page.locator('main tbody tr').count();
if (process.env.AENV_SHOTS) await page.screenshot({ path: path.join(process.env.AENV_SHOTS, 'gateway-nodes.png'), fullPage: true });
await browser.close();
console.log(`listed ${listed.length} sandboxes (all ${ids.length} expected), ${nodes} nodes`);
console.log('gateway dashboard passed');
