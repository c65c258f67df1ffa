// One sandbox: its details and state history (its lifecycle events, GET
// /events/sandboxes/{id}), a metrics chart from the node's metrics
// history, its logs followed live, a terminal over the agent's PTY and a
// file browser.
import { ApiError, call, eventName, explain, Logs, Metric, SandboxDetail, SandboxEvent } from '../api';
import { button, clear, el, say, status, time } from '../dom';
import { Chart } from '../chart';
import { poll } from '../poll';
import { Envd } from '../envd';
import { fileBrowser } from './files';

// The state each lifecycle event leaves a sandbox in.
const stateAfter: Record<string, string> = { created: 'running', resumed: 'running', paused: 'paused', killed: 'killed', forked: '' };

/** renderHistory shows a sandbox's events oldest first: each with the state change it made, and the path of states. */
function renderHistory(hist: HTMLElement, path: HTMLElement, evs: SandboxEvent[]): void {
  const sig = evs.map((e) => e.id).join(',');
  if (hist.dataset.sig === sig) return; // unchanged: left alone
  hist.dataset.sig = sig;
  clear(hist);
  const states: string[] = [];
  for (const e of evs) {
    const name = eventName(e.type);
    const to = stateAfter[name] ?? '';
    const from = states[states.length - 1];
    let what = name;
    if (to && from && from !== to) what = `${name}: ${from} → ${to}`;
    else if (to) what = `${name}: ${to}`;
    if (to && to !== from) states.push(to);
    hist.appendChild(el('li', { 'data-event': name }, el('time', { datetime: e.timestamp, text: time(e.timestamp) }), ' ', what));
  }
  if (!evs.length) hist.appendChild(el('li', { text: 'No events since the node started.' }));
  path.textContent = states.length ? `States: ${states.join(' → ')}` : '';
}

export async function sandboxPage(root: HTMLElement, id: string, signal: AbortSignal): Promise<void> {
  const path = `/sandboxes/${encodeURIComponent(id)}`;
  const msg = status();
  const details = el('dl', { class: 'details' });
  const hist = el('ol', { class: 'events', 'aria-label': 'State history' });
  const statePath = el('p', { class: 'state-path', id: 'state-path' });
  const actions = el('div', { class: 'actions' });
  const chart = new Chart('CPU use (%) and memory used (MiB)', ['cpu %', 'mem MiB'], ['#c33', '#36c']);
  const logs = el('pre', { class: 'logs', tabindex: '0', 'aria-label': 'Sandbox logs' });
  const termBox = el('div', { class: 'terminal-box' });
  const filesBox = el('div', { class: 'files-box' });
  root.append(
    el('h1', {}, 'Sandbox ', el('code', { text: id })), msg, actions,
    el('section', { 'aria-labelledby': 'd-h' }, el('h2', { id: 'd-h', text: 'Details' }), details),
    el('section', { 'aria-labelledby': 'h-h' }, el('h2', { id: 'h-h', text: 'State history' }),
      el('p', { class: 'note', text: 'The sandbox\'s lifecycle events, oldest first (the last 100, kept in memory by the node since it started).' }),
      statePath, hist),
    el('section', { 'aria-labelledby': 'm-h' }, el('h2', { id: 'm-h', text: 'Metrics' }), chart.node),
    el('section', { 'aria-labelledby': 't-h' }, el('h2', { id: 't-h', text: 'Terminal' }), termBox),
    el('section', { 'aria-labelledby': 'f-h' }, el('h2', { id: 'f-h', text: 'Files' }), filesBox),
    el('section', { 'aria-labelledby': 'l-h' }, el('h2', { id: 'l-h', text: 'Logs (following)' }), logs),
  );
  let sb = await call<SandboxDetail>(path, { signal });
  let lastState = '';
  const act = (label: string, f: () => Promise<unknown>) => button(label, async () => {
    say(msg, `${label}…`);
    try {
      await f();
      say(msg, `${label}: done`);
      if (!signal.aborted && location.hash.startsWith('#/sandbox/')) await load();
    } catch (e) {
      say(msg, `${label} failed: ${explain(e)}`, true);
    }
  }, { 'data-action': label.toLowerCase() });
  const load = async () => {
    sb = await call<SandboxDetail>(path, { signal });
    if (sb.state !== lastState) {
      lastState = sb.state;
      clear(actions);
      actions.append(sb.state === 'running'
        ? act('Pause', () => call(`${path}/pause`, { method: 'POST', body: {} }))
        : act('Resume', () => call(`${path}/connect`, { method: 'POST', body: { timeout: 300 } })),
      act('Kill', async () => { await call(path, { method: 'DELETE' }); location.hash = '#/sandboxes'; }));
      renderAgentParts();
    }
    clear(details);
    const rows: [string, string][] = [['State', sb.state], ['Template', sb.alias ?? sb.templateID], ['CPU', String(sb.cpuCount)],
      ['Memory', `${sb.memoryMB} MB`], ['Disk', `${sb.diskSizeMB} MB`], ['Started', time(sb.startedAt)], ['Ends', time(sb.endAt)],
      ['On timeout', sb.lifecycle?.onTimeout ?? ''], ['Agent version', sb.envdVersion],
      ['Metadata', Object.entries(sb.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(', ')]];
    for (const [k, v] of rows) details.append(el('dt', { text: k }), el('dd', { text: v, 'data-field': k.toLowerCase() }));
    try {
      const newest = await call<SandboxEvent[]>(`/events/sandboxes/${encodeURIComponent(id)}`, { query: { limit: 100 }, signal });
      renderHistory(hist, statePath, newest.reverse());
    } catch (e) {
      if (signal.aborted) return;
      delete hist.dataset.sig;
      clear(hist);
      hist.appendChild(el('li', { text: e instanceof ApiError && e.status === 404 ? `No state history: ${explain(e)}` : `The state history failed: ${explain(e)}` }));
    }
  };
  let agentParts: AbortController | null = null;
  const renderAgentParts = () => {
    agentParts?.abort();
    agentParts = new AbortController();
    signal.addEventListener('abort', () => agentParts?.abort());
    clear(termBox);
    clear(filesBox);
    if (sb.state !== 'running') {
      termBox.appendChild(el('p', { text: 'The sandbox is paused: resume it to open a terminal.' }));
      filesBox.appendChild(el('p', { text: 'The sandbox is paused: resume it to browse its files.' }));
      return;
    }
    const envd = new Envd(id, sb.envdAccessToken);
    const s = agentParts.signal;
    termBox.appendChild(button('Open terminal', async (e) => {
      (e.target as HTMLElement).remove();
      const { openTerminal } = await import('./terminal'); // xterm.js, loaded when first needed
      openTerminal(termBox, envd, s);
    }, { id: 'open-terminal' }));
    fileBrowser(filesBox, envd, s);
  };
  poll(signal, 3000, load, (e) => say(msg, explain(e), true));
  poll(signal, 5000, async () => {
    if (sb.state !== 'running') return;
    const ms = await call<Metric[]>(`${path}/metrics`, { signal });
    chart.update(ms.map((m) => m.timestampUnix), [ms.map((m) => Math.round(m.cpuUsedPct * 10) / 10), ms.map((m) => Math.round(m.memUsed / 1048576))]);
  }, () => {});
  let since = 0;
  poll(signal, 2000, async () => {
    if (sb.state !== 'running') return;
    const l = await call<Logs>(`${path}/logs`, { query: { start: since || undefined, limit: 1000 }, signal });
    const fresh = l.logs.filter((x) => new Date(x.timestamp).getTime() > since || !since);
    if (!fresh.length) return;
    const stick = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 8;
    logs.appendChild(document.createTextNode(fresh.map((x) => `${x.timestamp} ${x.line}\n`).join('')));
    since = Math.max(since, ...fresh.map((x) => new Date(x.timestamp).getTime()));
    if (stick) logs.scrollTop = logs.scrollHeight;
  }, () => {});
}
