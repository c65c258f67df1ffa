// A file browser over the agent: ListDir to list a directory, /files to
// upload (multipart) and download. Names are shown as text only.
import { el, button, clear, field, say, status, table } from '../dom';
import { Envd, Entry } from '../envd';
import { explain } from '../api';

export function fileBrowser(box: HTMLElement, envd: Envd, signal: AbortSignal): void {
  let dir = '/home/user';
  const msg = status();
  const pathIn = el('input', { type: 'text', name: 'path', value: dir, spellcheck: 'false' });
  const upload = el('input', { type: 'file', name: 'upload', multiple: true });
  const list = el('div', { class: 'files' });
  const go = el('form', { class: 'filters', 'aria-label': 'Directory' }, field('Directory', pathIn), el('button', { type: 'submit' }, 'Open'));
  go.addEventListener('submit', (e) => { e.preventDefault(); dir = pathIn.value.trim() || '/'; void show(); });
  const up = el('form', { class: 'filters', 'aria-label': 'Upload' }, field('Upload files to this directory', upload), el('button', { type: 'submit' }, 'Upload'));
  up.addEventListener('submit', async (e) => {
    e.preventDefault();
    const files = [...(upload.files ?? [])];
    if (!files.length) return say(msg, 'Choose a file first.', true);
    try {
      for (const f of files) {
        say(msg, `Uploading ${f.name}…`);
        await envd.upload(join(dir, f.name), f);
      }
      say(msg, `Uploaded ${files.map((f) => f.name).join(', ')} to ${dir}`);
      upload.value = '';
      await show();
    } catch (err) {
      say(msg, `Upload failed: ${explain(err)}`, true);
    }
  });
  box.append(go, up, msg, list);
  const show = async () => {
    pathIn.value = dir;
    try {
      const r = await envd.listDir(dir);
      if (signal.aborted) return;
      const entries = (r.entries ?? []).sort((a, b) => a.name.localeCompare(b.name));
      clear(list);
      const rows = entries.map((e: Entry) => {
        const isDir = e.type === 'FILE_TYPE_DIRECTORY';
        return [
          isDir ? button(e.name + '/', () => { dir = e.path; void show(); }, { class: 'link', 'aria-label': `Open directory ${e.name}` })
            : el('span', { text: e.name }),
          isDir ? 'directory' : String(e.size ?? ''), e.permissions ?? '',
          isDir ? '' : button('Download', () => void download(envd, e, msg), { 'aria-label': `Download ${e.name}` }),
        ];
      });
      const parent = dir === '/' ? null : button('.. (parent)', () => { dir = dir.replace(/\/[^/]*\/?$/, '') || '/'; void show(); }, { class: 'link' });
      if (parent) list.append(parent);
      list.append(table(['Name', 'Size', 'Mode', ''], rows, `${entries.length} entries in ${dir}`));
    } catch (err) {
      say(msg, `Cannot list ${dir}: ${explain(err)}`, true);
    }
  };
  void show();
}

function join(d: string, name: string): string {
  return d.endsWith('/') ? d + name : `${d}/${name}`;
}

async function download(envd: Envd, e: Entry, msg: HTMLElement): Promise<void> {
  try {
    const blob = await envd.download(e.path);
    const url = URL.createObjectURL(blob);
    const a = el('a', { href: url, download: e.name });
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    say(msg, `Downloaded ${e.name} (${blob.size} bytes)`);
  } catch (err) {
    say(msg, `Download failed: ${explain(err)}`, true);
  }
}
