// The dashboard in headless Chromium (Debian's chromium, driven by
// playwright-core) against a real node. Run by dashboard/e2e's Go test:
//   AENV_URL=http://127.0.0.1:<api> AENV_API_KEY=... AENV_SHOTS=<dir> \
//   AENV_E2B_SDK_DIR=<dir with node_modules/e2b> [AENV_BUILD=1] node browser.mjs
// Prints "ok <step>" per step and "dashboard scenario passed" at the end;
// exits non-zero on the first failure. Screenshots go to AENV_SHOTS.
import assert from 'node:assert/strict';
import http from 'node:http';
import { createRequire } from 'node:module';
import path from 'node:path';
import { chromium } from 'playwright-core';

const base = process.env.AENV_URL;
const key = process.env.AENV_API_KEY;
const shots = process.env.AENV_SHOTS;
const require = createRequire(path.join(process.env.AENV_E2B_SDK_DIR, 'package.json'));
const { Sandbox } = require('e2b');

async function step(name, f) {
  const t0 = Date.now();
  try {
    await f();
  } catch (e) {
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
    await page?.screenshot({ path: path.join(shots, 'failure.png'), fullPage: true }).catch(() => {});
    await browser?.close().catch(() => {});
    process.exit(1);
  }
  console.log(`ok ${name} (${Date.now() - t0} ms)`);
}

const shot = (name) => page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
const go = async (hash) => {
  await page.evaluate((h) => { location.hash = h; }, hash);
  await page.locator('main h1').first().waitFor();
};
const statusText = () => page.locator('main .status').first().textContent();

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
const page = await context.newPage();
const problems = [];
page.on('console', (m) => {
  if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) problems.push(m.text());
});
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.setDefaultTimeout(60_000);

await step('a bad key shows a clear error', async () => {
  const resp = await page.goto(`${base}/dashboard/`);
  assert.equal(resp.status(), 200);
  const csp = resp.headers()['content-security-policy'];
  assert.match(csp, /script-src 'self'/);
  assert.doesNotMatch(csp, /unsafe-inline/);
  await page.getByLabel('API key').fill('e2b_wrongwrongwrongwrongwrongwrongwrongwrong');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByText('Sign-in failed: the API key was refused').waitFor();
  assert.match(await statusText(), /401/);
  assert.equal(await page.evaluate(() => sessionStorage.getItem('aenv.apiKey')), null);
  await shot('signin-bad-key');
});

await step('sign in', async () => {
  await page.getByLabel('API key').fill(key);
  await page.keyboard.press('Enter'); // keyboard only
  await page.locator('#count-running').waitFor();
  assert.ok(!page.url().includes(key), 'the key is in the URL');
  assert.equal(await page.evaluate(() => sessionStorage.getItem('aenv.apiKey')), key);
  assert.equal(await page.evaluate(() => document.cookie), '');
  await shot('overview-before');
});

// A real webhook receiver on loopback: answers 200 and keeps what came.
const received = [];
const receiver = http.createServer((req, res) => {
  let body = '';
  req.on('data', (c) => { body += c; });
  req.on('end', () => {
    try { received.push({ headers: req.headers, body: JSON.parse(body) }); } catch { received.push({ headers: req.headers, body }); }
    res.writeHead(200).end('ok');
  });
});
await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
const hookURL = `http://127.0.0.1:${receiver.address().port}/hook`;

await step('add a webhook from the page', async () => {
  await go('#/webhooks');
  await page.getByLabel('URL', { exact: true }).fill(hookURL);
  await page.getByLabel('Name', { exact: true }).fill('dash-receiver');
  await page.getByLabel('Events (comma-separated)').fill('sandbox.lifecycle.created, sandbox.lifecycle.paused, sandbox.lifecycle.resumed');
  await page.getByRole('button', { name: 'Add webhook' }).click();
  await page.getByText('Webhook added').waitFor();
  await page.locator('main table', { hasText: hookURL }).waitFor();
  await page.getByText('Deliveries of dash-receiver: none yet').waitFor();
});

let createsBefore = 0;
let sumBefore = 0;
await step('overview counts', async () => {
  await go('#/overview');
  await page.waitForFunction(() => Number(document.querySelector('.chart')?.dataset.points ?? 0) >= 1);
  createsBefore = Number(await page.locator('#count-creates').textContent());
  sumBefore = JSON.parse(await page.locator('.chart').getAttribute('data-sums'))[2];
});

let id = '';
await step('create a sandbox from the page', async () => {
  await go('#/sandboxes');
  await page.locator('select[name=template] option').first().waitFor({ state: 'attached' });
  await page.getByLabel('Template').selectOption('base');
  await page.getByLabel('Timeout (seconds)').fill('600');
  await page.getByLabel('Metadata', { exact: true }).fill('suite=dashboard\nowner=<b>x</b>');
  await page.getByRole('button', { name: 'Create', exact: true }).click();
  await page.getByText(/^Created sandbox /).waitFor({ timeout: 180_000 });
  id = (await statusText()).replace('Created sandbox ', '').trim();
  assert.match(id, /^[a-z0-9]+$/);
  await page.locator(`a[href="#/sandbox/${id}"]`).waitFor();
  // Metadata is text: the markup in it is shown, not parsed.
  assert.equal(await page.locator('main table b').count(), 0);
  await page.getByText('owner=<b>x</b>').first().waitFor();
  await page.getByLabel('State').selectOption('paused');
  await page.getByText('No sandboxes match.').waitFor();
  await page.getByLabel('State').selectOption('running,paused');
  await page.locator(`a[href="#/sandbox/${id}"]`).waitFor();
  await shot('sandboxes');
});

await step('the overview chart updates after the create', async () => {
  await go('#/overview');
  await page.waitForFunction((c) => Number(document.getElementById('count-creates')?.textContent) > c, createsBefore);
  await page.waitForFunction((s) => JSON.parse(document.querySelector('.chart')?.dataset.sums ?? '[0,0,0]')[2] > s, sumBefore);
  assert.ok(Number(await page.locator('#count-running').textContent()) >= 1);
  // The recent events name the sandbox created, and link to its page.
  await page.locator('#recent-events li[data-event=created]', { hasText: id }).first().waitFor();
  assert.equal(await page.locator(`#recent-events a[href="#/sandbox/${id}"]`).count() >= 1, true);
  await page.waitForTimeout(3500); // one more sample: the chart draws a line
  await shot('overview');
});

await step('terminal: echo hi', async () => {
  await go(`#/sandbox/${id}`);
  await page.getByRole('button', { name: 'Open terminal' }).click();
  await page.waitForFunction(() => document.getElementById('terminal')?.dataset.pid);
  await page.locator('#terminal').click();
  await page.keyboard.type('echo hi');
  await page.keyboard.press('Enter');
  // The output line "hi" (the shell may put escape sequences, such as
  // bracketed-paste off, before it; the echoed command line is "echo hi").
  await page.waitForFunction(() => /[\r\n]hi\r?\n/.test(document.getElementById('terminal')?.dataset.output ?? ''));
  // Drawn by xterm.js too (its rows are text in the page).
  await page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')].some((r) => r.textContent.trim() === 'hi'));
});

const content = `hello from the dashboard ${Date.now()}\n`;
await step('upload a file and read it with the SDK', async () => {
  await page.getByLabel('Upload files to this directory').setInputFiles({ name: 'dash-upload.txt', mimeType: 'text/plain', buffer: Buffer.from(content) });
  await page.getByRole('button', { name: 'Upload', exact: true }).click();
  await page.getByText('Uploaded dash-upload.txt').waitFor();
  await page.locator('.files td', { hasText: 'dash-upload.txt' }).first().waitFor();
  const sbx = await Sandbox.connect(id, { apiKey: key, apiUrl: base, sandboxUrl: base });
  assert.equal(await sbx.files.read('/home/user/dash-upload.txt'), content);
  await sbx.files.write('/home/user/from-sdk.txt', 'written by the SDK\n');
  await page.getByRole('button', { name: 'Open', exact: true }).click();
  await page.locator('.files td', { hasText: 'from-sdk.txt' }).first().waitFor();
  const [dl] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: 'Download from-sdk.txt' }).click()]);
  const chunks = [];
  for await (const c of await dl.createReadStream()) chunks.push(c);
  assert.equal(Buffer.concat(chunks).toString(), 'written by the SDK\n');
  await page.locator('.logs').first().waitFor();
  await page.waitForFunction(() => (document.querySelector('pre.logs')?.textContent ?? '').length > 0);
  await shot('sandbox');
});

await step('pause and resume from the page', async () => {
  await page.locator('main .actions [data-action=pause]').click();
  await page.locator('dd[data-field=state]', { hasText: 'paused' }).waitFor({ timeout: 180_000 });
  assert.equal((await (await fetch(`${base}/sandboxes/${id}`, { headers: { 'X-API-Key': key } })).json()).state, 'paused');
  await page.getByText('resume it to open a terminal').waitFor();
  await shot('sandbox-paused');
  await page.locator('main .actions [data-action=resume]').click();
  await page.locator('dd[data-field=state]', { hasText: 'running' }).waitFor({ timeout: 180_000 });
  await page.getByRole('button', { name: 'Open terminal' }).waitFor();
  const sbx = await Sandbox.connect(id, { apiKey: key, apiUrl: base, sandboxUrl: base });
  assert.equal(await sbx.files.read('/home/user/dash-upload.txt'), content);
  // The state history is the node's lifecycle events of the sandbox.
  await page.locator('#state-path', { hasText: 'running → paused → running' }).waitFor();
  assert.equal(await page.locator('#state-path').textContent(), 'States: running → paused → running');
  const hist = await page.locator('ol[aria-label="State history"]').textContent();
  assert.match(hist, /created: running/);
  assert.match(hist, /paused: running → paused/);
  assert.match(hist, /resumed: paused → running/);
  await shot('sandbox-history');
});

await step('the webhook\'s deliveries are listed', async () => {
  // The receiver got the sandbox's events, signed by the node.
  const types = () => received.filter((r) => r.body?.sandboxId === id).map((r) => r.body.type);
  for (let i = 0; i < 300 && !types().includes('sandbox.lifecycle.resumed'); i++) await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(types(), ['sandbox.lifecycle.created', 'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed']);
  assert.ok(received.every((r) => r.headers['e2b-signature']), 'a delivery is not signed');
  await go('#/webhooks');
  const rows = page.locator('section.deliveries tbody tr', { hasText: id });
  await rows.filter({ hasText: 'resumed' }).first().waitFor();
  for (const ev of ['created', 'paused', 'resumed']) {
    const row = rows.filter({ has: page.locator('td', { hasText: new RegExp(`^${ev}$`) }) }).first();
    assert.match(await row.textContent(), /HTTP 200/);
    assert.match(await row.textContent(), /delivered/);
  }
  await shot('webhooks-deliveries');
});

for (const [hash, h1] of [['#/snapshots', 'Snapshots'], ['#/volumes', 'Volumes'], ['#/nodes', 'Nodes'], ['#/webhooks', 'Webhooks']]) {
  await step(`page ${h1}`, async () => {
    await go(hash);
    await page.locator('main table caption').first().waitFor();
    assert.equal(await page.locator('main h1').first().textContent(), h1);
    assert.equal(await page.locator('main .status.error').count(), 0, await statusText());
    await shot(h1.toLowerCase());
  });
}

await step('keyboard navigation reaches the pages', async () => {
  await go('#/overview');
  await page.reload(); // focus starts at the top of the document
  await page.locator('#count-running').waitFor();
  await page.keyboard.press('Tab'); // the skip link first
  assert.equal(await page.evaluate(() => document.activeElement?.className), 'skip');
  for (let i = 0; i < 2; i++) await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Sandboxes');
  await page.keyboard.press('Enter');
  await page.locator('main h1', { hasText: 'Sandboxes' }).waitFor();
  const unlabeled = await page.evaluate(() => [...document.querySelectorAll('main input, main select, main textarea')]
    .filter((e) => !e.labels?.length && !e.getAttribute('aria-label')).map((e) => e.outerHTML));
  assert.deepEqual(unlabeled, []);
});

if (process.env.AENV_BUILD === '1') {
  await step('a template build\'s log followed', async () => {
    await go('#/templates');
    await page.getByLabel('Name', { exact: true }).fill(`dash-${Date.now().toString(36)}`);
    await page.getByLabel('From template').fill('base');
    await page.getByLabel('Commands').fill('echo built-by-the-dashboard > /home/user/mark.txt; echo step-output-from-dashboard');
    await page.getByRole('button', { name: 'Build', exact: true }).click();
    await page.locator('#build-log').waitFor();
    await page.waitForFunction(() => ['ready', 'error'].includes(document.getElementById('build-log')?.dataset.status ?? ''), null, { timeout: 600_000 });
    const log = await page.locator('#build-log').textContent();
    await shot('templates');
    assert.equal(await page.locator('#build-log').getAttribute('data-status'), 'ready', log);
    assert.match(log, /step-output-from-dashboard/); // the RUN step's own output, followed
    await page.locator('main tbody tr', { hasText: 'dash-' }).locator('.state.ready').waitFor();
  });
} else {
  await step('templates page', async () => {
    await go('#/templates');
    await page.locator('main table caption').first().waitFor();
    await shot('templates');
  });
}

await step('kill from the page', async () => {
  await go(`#/sandbox/${id}`);
  await page.locator('main .actions [data-action=kill]').click();
  await page.locator('main h1', { hasText: 'Sandboxes' }).waitFor();
  assert.equal((await fetch(`${base}/sandboxes/${id}`, { headers: { 'X-API-Key': key } })).status, 404);
});

await step('no CSP violation or page error', async () => {
  assert.deepEqual(problems, []);
});

await browser.close();
receiver.close();
console.log('dashboard scenario passed');
