// Templates: the list with each one's latest build, its tags, the build's
// log followed live (GET .../builds/{buildID}/status with logsOffset), a
// form to build a template from another with shell steps, and delete. The
// API names a template's latest build only: older builds are not listed.
import { call, explain, BuildInfo, Template } from '../api';
import { button, clear, el, field, say, status, table, time } from '../dom';
import { poll } from '../poll';

export function templates(root: HTMLElement, _arg: string, signal: AbortSignal): void {
  const msg = status();
  const listBox = el('div');
  const logBox = el('section', { 'aria-labelledby': 'bl-h' });
  let shown = '';
  const refresh = async () => {
    const ts = await call<Template[]>('/templates', { signal });
    const sig = JSON.stringify(ts.map((t) => [t.templateID, t.buildID, t.buildStatus, t.aliases]));
    if (sig === shown) return;
    shown = sig;
    clear(listBox);
    const rows = ts.map((t) => {
      const tags = el('span', { class: 'tags' });
      call<{ tag: string }[]>(`/templates/${encodeURIComponent(t.templateID)}/tags`, { signal })
        .then((tg) => { tags.textContent = (tg ?? []).map((x) => x.tag).join(', '); }).catch(() => { tags.textContent = ''; });
      return [
        el('code', { text: t.templateID }), (t.aliases ?? t.names ?? []).join(', '), tags,
        el('span', { class: `state ${t.buildStatus}`, text: t.buildStatus }), `${t.cpuCount} CPU, ${t.memoryMB} MB`, time(t.updatedAt),
        el('div', { class: 'actions' },
          button('Build log', () => followBuild(logBox, t.templateID, t.buildID, signal, refresh), { 'aria-label': `Build log of ${t.templateID}`, 'data-action': 'build-log', 'data-id': t.templateID }),
          button('Delete', async () => {
            if (!confirm(`Delete template ${t.templateID}?`)) return;
            try {
              await call(`/templates/${encodeURIComponent(t.templateID)}`, { method: 'DELETE' });
              say(msg, `Deleted ${t.templateID}`);
              await refresh();
            } catch (e) {
              say(msg, `Delete failed: ${explain(e)}`, true);
            }
          }, { 'aria-label': `Delete ${t.templateID}` })),
      ];
    });
    listBox.appendChild(table(['Template', 'Names', 'Tags', 'Build', 'Size', 'Updated', 'Actions'], rows, `${ts.length} templates`));
  };
  root.append(el('h1', { text: 'Templates' }), buildForm(msg, logBox, signal, refresh), msg, listBox, logBox);
  poll(signal, 5000, refresh, (e) => say(msg, explain(e), true));
}

function buildForm(msg: HTMLElement, logBox: HTMLElement, signal: AbortSignal, refresh: () => Promise<void>): HTMLElement {
  const name = el('input', { type: 'text', name: 'templateName', required: true, pattern: '[a-z0-9][a-z0-9_-]*' });
  const from = el('input', { type: 'text', name: 'fromTemplate', value: 'base', required: true });
  const steps = el('textarea', { name: 'steps', rows: 3, placeholder: 'one shell command a line (RUN steps)' });
  const cpus = el('input', { type: 'number', name: 'cpuCount', min: '1', max: '64', placeholder: 'default' });
  const mem = el('input', { type: 'number', name: 'memoryMB', min: '128', step: '128', placeholder: 'default' });
  const tags = el('input', { type: 'text', name: 'tags', placeholder: 'v1, stable' });
  const form = el('form', { class: 'create', 'aria-labelledby': 'b-h' },
    el('h2', { id: 'b-h', text: 'Build a template' }),
    field('Name', name), field('From template', from), field('Commands', steps), field('CPUs', cpus), field('Memory (MB)', mem),
    field('Tags', tags), el('button', { type: 'submit' }, 'Build'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const t = await call<{ templateID: string; buildID: string }>('/v3/templates', { method: 'POST', body: {
        name: name.value.trim(), cpuCount: Number(cpus.value) || undefined, memoryMB: Number(mem.value) || undefined,
        tags: tags.value.split(',').map((x) => x.trim()).filter(Boolean),
      } });
      const run = steps.value.split('\n').map((s) => s.trim()).filter(Boolean).map((c) => ({ type: 'RUN', args: [c] }));
      await call(`/v2/templates/${encodeURIComponent(t.templateID)}/builds/${encodeURIComponent(t.buildID)}`,
        { method: 'POST', body: { fromTemplate: from.value.trim(), steps: run } });
      say(msg, `Build ${t.buildID} of ${t.templateID} started`);
      followBuild(logBox, t.templateID, t.buildID, signal, refresh);
      await refresh();
    } catch (err) {
      say(msg, `Build failed to start: ${explain(err)}`, true);
    }
  });
  return form;
}

let following: AbortController | null = null;

/** followBuild shows a build's log, fetching new lines until the build ends. */
function followBuild(box: HTMLElement, templateID: string, buildID: string, page: AbortSignal, onDone: () => Promise<void>): void {
  following?.abort();
  const mine = new AbortController();
  following = mine;
  page.addEventListener('abort', () => mine.abort());
  clear(box);
  const st = el('p', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const pre = el('pre', { class: 'logs', id: 'build-log', tabindex: '0', 'aria-label': `Build log of ${templateID}` });
  box.append(el('h2', { id: 'bl-h' }, 'Build log of ', el('code', { text: templateID })), st, pre);
  let offset = 0;
  let done = false;
  poll(mine.signal, 1500, async () => {
    if (done) return;
    const info = await call<BuildInfo>(`/templates/${encodeURIComponent(templateID)}/builds/${encodeURIComponent(buildID)}/status`,
      { query: { logsOffset: offset, limit: 100 }, signal: mine.signal });
    const lines = info.logEntries?.length ? info.logEntries.map((l) => `${l.timestamp} ${l.level} ${l.message}`) : info.logs ?? [];
    if (lines.length) {
      pre.appendChild(document.createTextNode(lines.join('\n') + '\n'));
      pre.scrollTop = pre.scrollHeight;
      offset += lines.length;
    }
    st.textContent = `Build ${buildID}: ${info.status}${info.reason?.message ? ' (' + info.reason.message + ')' : ''}`;
    pre.dataset.status = info.status;
    if ((info.status === 'ready' || info.status === 'error') && lines.length < 100) {
      done = true;
      await onDone(); // the list shows the build's end
    }
  }, (e) => { st.textContent = explain(e); });
}
