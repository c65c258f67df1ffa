// The sandboxes page's load time in headless Chromium, against a plain
// fetch of the same list (the reference), each the median of several
// rounds. Run by bench/dashboard: AENV_URL, AENV_API_KEY, AENV_LISTED.
// AENV_SHOT names a screenshot of the page to write. Prints one JSON line {"page": ms, "ready": ms, "fetch": ms}.
import { chromium } from 'playwright-core';

const base = process.env.AENV_URL;
const key = process.env.AENV_API_KEY;
const listed = Number(process.env.AENV_LISTED);
const rounds = 9;
const median = (xs) => xs.sort((a, b) => a - b)[xs.length >> 1];

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
await context.addInitScript((k) => sessionStorage.setItem('aenv.apiKey', k), key);
const page = await context.newPage();
const pageTimes = [];
const fetchTimes = [];
const readyTimes = []; // navigation start to the page's script run
for (let i = 0; i < rounds + 1; i++) {
  await page.goto('about:blank');
  await page.goto(`${base}/dashboard/#/sandboxes`);
  await page.locator('main table caption', { hasText: `${listed} sandboxes` }).waitFor({ timeout: 60_000 });
  const pageMs = await page.evaluate(() => performance.getEntriesByName('aenv:sandboxes-listed').at(-1).startTime);
  const ready = await page.evaluate(() => performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd);
  const fetchMs = await page.evaluate(async (k) => {
    const t = performance.now();
    let token = '';
    let n = 0;
    do {
      const r = await fetch(`/v2/sandboxes?state=running,paused&limit=100${token ? '&nextToken=' + token : ''}`, { headers: { 'X-API-Key': k }, cache: 'no-store' });
      n += (await r.json()).length;
      token = r.headers.get('X-Next-Token') ?? '';
    } while (token);
    return performance.now() - t + 0 * n;
  }, key);
  if (i > 0) { // the first round warms the browser's and the server's caches
    pageTimes.push(pageMs);
    readyTimes.push(ready);
    fetchTimes.push(fetchMs);
  }
}
if (process.env.AENV_SHOT) await page.screenshot({ path: process.env.AENV_SHOT, fullPage: false });
await browser.close();
console.log(JSON.stringify({ page: median(pageTimes), ready: median(readyTimes), fetch: median(fetchTimes) }));
