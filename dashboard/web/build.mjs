// Builds the dashboard's front end into ../dist: scripts (the page, and
// the terminal loaded when opened) and a style sheet named by their
// content hash (served as immutable), and index.html loading them (no
// inline script or style: the page's CSP forbids both).
import * as esbuild from 'esbuild';
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, '..', 'dist');

const result = await esbuild.build({
  entryPoints: [join(here, 'src', 'main.ts'), join(here, 'src', 'style.css')],
  bundle: true,
  splitting: true, // the terminal (xterm.js) loads when a terminal is opened
  minify: true,
  sourcemap: false,
  format: 'esm',
  target: ['chrome110', 'firefox110', 'safari16'],
  entryNames: 'assets/[name]-[hash]',
  chunkNames: 'assets/chunk-[hash]',
  outdir: dist,
  write: false,
  metafile: true,
  logLevel: 'warning',
});

// Everything but the committed README goes: stale hashed files must not pile up.
for (const name of readdirSync(dist)) {
  if (name !== 'README') rmSync(join(dist, name), { recursive: true, force: true });
}
mkdirSync(join(dist, 'assets'), { recursive: true });
for (const f of result.outputFiles) writeFileSync(f.path, f.contents);
const entry = (src) => Object.entries(result.metafile.outputs).find(([, o]) => o.entryPoint?.endsWith(src))[0];
const js = relative(dist, resolve(entry('src/main.ts')));
const css = relative(dist, resolve(entry('src/style.css')));
const page = readFileSync(join(here, 'index.html'), 'utf8')
  .replace('%SCRIPT%', '/dashboard/' + js)
  .replace('%STYLE%', '/dashboard/' + css);
writeFileSync(join(dist, 'index.html'), page);
console.log(`dashboard: built ${js} and ${css} (${result.outputFiles.length} files)`);
