// Builds the dashboard's front end into ../dist: one script and one style
// sheet named by their content hash (served as immutable), and index.html
// loading them (no inline script or style: the page's CSP forbids both).
import * as esbuild from 'esbuild';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, '..', 'dist');

const result = await esbuild.build({
  entryPoints: [join(here, 'src', 'main.ts'), join(here, 'src', 'style.css')],
  bundle: true,
  minify: true,
  sourcemap: false,
  format: 'esm',
  target: ['chrome110', 'firefox110', 'safari16'],
  write: false,
  outdir: 'out',
  logLevel: 'warning',
});

// Everything but the committed README goes: stale hashed files must not pile up.
for (const name of readdirSync(dist)) {
  if (name !== 'README') rmSync(join(dist, name), { recursive: true, force: true });
}
mkdirSync(join(dist, 'assets'), { recursive: true });
const names = {};
for (const f of result.outputFiles) {
  const ext = f.path.endsWith('.css') ? 'css' : 'js';
  const hash = createHash('sha256').update(f.contents).digest('hex').slice(0, 12);
  const name = `assets/app-${hash}.${ext}`;
  writeFileSync(join(dist, name), f.contents);
  names[ext] = name;
}
const page = readFileSync(join(here, 'index.html'), 'utf8')
  .replace("%SCRIPT%", "/dashboard/" + names.js)
  .replace("%STYLE%", "/dashboard/" + names.css);
writeFileSync(join(dist, 'index.html'), page);
console.log(`dashboard: built ${names.js} and ${names.css}`);
