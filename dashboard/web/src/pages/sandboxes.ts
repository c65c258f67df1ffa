// Sandboxes: the list (filtered by state and metadata), a create form, and
// each sandbox's actions: pause, resume, fork with a count, snapshot, set
// timeout, kill. CPU and memory come from the template: the create API
// (POST /sandboxes) takes neither, so the form cannot offer them.
import { call, explain, listSandboxes, ListedSandbox, Sandbox, Template } from '../api';
import { button, clear, el, field, say, status, table, time } from '../dom';
import { poll } from '../poll';

/** parseMetadata reads "k=v" lines (or comma-separated pairs) into an object. */
export function parseMetadata(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of text.split(/[\n,]/)) {
    const p = part.trim();
    if (!p) continue;
    const i = p.indexOf('=');
    if (i <= 0) throw new Error(`metadata "${p}": write key=value`);
    out[p.slice(0, i).trim()] = p.slice(i + 1).trim();
  }
  return out;
}

export function sandboxes(root: HTMLElement, _arg: string, signal: AbortSignal): void {
  const msg = status();
  const listBox = el('div', { class: 'list' });
  const stateSel = el('select', { name: 'state' },
    el('option', { value: 'running,paused', text: 'all' }), el('option', { value: 'running', text: 'running' }),
    el('option', { value: 'paused', text: 'paused' }));
  const mdFilter = el('input', { type: 'text', name: 'metadataFilter', placeholder: 'key=value' });
  const filters = el('form', { class: 'filters', 'aria-label': 'Filter sandboxes' },
    field('State', stateSel), field('Metadata filter', mdFilter), el('button', { type: 'submit' }, 'Filter'));
  filters.addEventListener('submit', (e) => { e.preventDefault(); void refresh(); });
  stateSel.addEventListener('change', () => void refresh());

  let shown = '';
  const refresh = async () => {
    let md = '';
    try {
      md = new URLSearchParams(parseMetadata(mdFilter.value)).toString();
    } catch (e) {
      say(msg, explain(e), true);
      return;
    }
    const list = await listSandboxes(stateSel.value, md, signal);
    // Unchanged lists are left alone, so focus and typed values stay.
    const sig = JSON.stringify(list.map((s) => [s.sandboxID, s.state, s.endAt, s.metadata]));
    if (sig !== shown) renderList(listBox, list, msg, refresh);
    shown = sig;
  };
  root.append(el('h1', { text: 'Sandboxes' }), createForm(msg, refresh),
    el('h2', { text: 'List' }), filters, msg, listBox);
  poll(signal, 5000, refresh, (e) => say(msg, explain(e), true));
}

function createForm(msg: HTMLElement, refresh: () => Promise<void>): HTMLElement {
  const tpl = el('select', { name: 'template', required: true });
  const timeout = el('input', { type: 'number', name: 'timeout', min: '1', value: '300' });
  const md = el('textarea', { name: 'metadata', rows: 2, placeholder: 'key=value, one a line' });
  const autoPause = el('input', { type: 'checkbox', name: 'autoPause' });
  const form = el('form', { class: 'create', 'aria-labelledby': 'create-h' },
    el('h2', { id: 'create-h', text: 'Create a sandbox' }),
    field('Template', tpl), field('Timeout (seconds)', timeout), field('Metadata', md), field('Pause on timeout', autoPause),
    el('p', { class: 'note', text: 'CPU and memory are the template\'s: the create API takes neither.' }),
    el('button', { type: 'submit' }, 'Create'));
  call<Template[]>('/templates').then((ts) => {
    for (const t of ts) {
      const name = t.aliases?.[0] ?? t.names?.[0] ?? t.templateID;
      tpl.appendChild(el('option', { value: name, text: `${name} (${t.cpuCount} CPU, ${t.memoryMB} MB)` }));
    }
  }).catch((e) => say(msg, explain(e), true));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const body = { templateID: tpl.value, timeout: Number(timeout.value) || undefined, metadata: parseMetadata(md.value), autoPause: autoPause.checked };
      say(msg, `Creating a sandbox from ${tpl.value}…`);
      const sb = await call<Sandbox>('/sandboxes', { method: 'POST', body });
      say(msg, `Created sandbox ${sb.sandboxID}`);
      await refresh();
    } catch (err) {
      say(msg, `Create failed: ${explain(err)}`, true);
    }
  });
  return form;
}

function renderList(box: HTMLElement, list: ListedSandbox[], msg: HTMLElement, refresh: () => Promise<void>): void {
  clear(box);
  if (!list.length) {
    box.appendChild(el('p', { text: 'No sandboxes match.' }));
    return;
  }
  list.sort((a, b) => b.startedAt.localeCompare(a.startedAt));
  const act = (label: string, what: string, id: string, f: () => Promise<unknown>) =>
    button(label, async () => {
      say(msg, `${what} ${id}…`);
      try {
        await f();
        say(msg, `${what} ${id}: done`);
        await refresh();
      } catch (e) {
        say(msg, `${what} ${id} failed: ${explain(e)}`, true);
      }
    }, { 'aria-label': `${label} ${id}`, 'data-action': label.toLowerCase(), 'data-id': id });
  const rows = list.map((s) => {
    const id = encodeURIComponent(s.sandboxID);
    const forkN = el('input', { type: 'number', min: '1', max: '16', value: '1', class: 'small', 'aria-label': `Fork count for ${s.sandboxID}` });
    const tmo = el('input', { type: 'number', min: '1', value: '300', class: 'small', 'aria-label': `Timeout in seconds for ${s.sandboxID}` });
    const actions = el('div', { class: 'actions' },
      s.state === 'running'
        ? act('Pause', 'Pausing', s.sandboxID, () => call(`/sandboxes/${id}/pause`, { method: 'POST', body: {} }))
        : act('Resume', 'Resuming', s.sandboxID, () => call(`/sandboxes/${id}/connect`, { method: 'POST', body: { timeout: 300 } })),
      forkN, act('Fork', 'Forking', s.sandboxID, () => call(`/sandboxes/${id}/fork`, { method: 'POST', body: { count: Number(forkN.value) || 1 } })),
      act('Snapshot', 'Snapshotting', s.sandboxID, () => call(`/sandboxes/${id}/snapshots`, { method: 'POST', body: {} })),
      tmo, act('Set timeout', 'Setting the timeout of', s.sandboxID, () => call(`/sandboxes/${id}/timeout`, { method: 'POST', body: { timeout: Number(tmo.value) } })),
      act('Kill', 'Killing', s.sandboxID, () => call(`/sandboxes/${id}`, { method: 'DELETE' })));
    return [
      el('a', { href: `#/sandbox/${id}`, text: s.sandboxID }),
      el('span', { class: `state ${s.state}`, text: s.state }),
      s.alias ?? s.templateID, `${s.cpuCount} CPU, ${s.memoryMB} MB`, time(s.startedAt), time(s.endAt),
      el('code', { text: Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(', ') }),
      actions,
    ];
  });
  box.appendChild(table(['Sandbox', 'State', 'Template', 'Size', 'Started', 'Ends', 'Metadata', 'Actions'], rows, `${list.length} sandboxes`));
  performance.mark('aenv:sandboxes-listed'); // the page-load benchmark's end
}
