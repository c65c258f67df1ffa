// Overview: running and paused counts and the create rate over time, node
// capacity, recent events. The API has no history of counts, so the chart
// is gathered by this page while the dashboard is open: counts from GET
// /nodes every few seconds (creates as the change of the nodes'
// createSuccesses counters). The recent events are the node's (or, through
// the gateway, every node's) lifecycle events: GET /events/sandboxes.
import { ApiError, call, eventName, explain, listSandboxes, NodeInfo, SandboxEvent } from '../api';
import { clear, el, say, status, table, time } from '../dom';
import { Chart } from '../chart';
import { poll } from '../poll';

interface Sample { t: number; running: number; paused: number; creates: number }
const samples: Sample[] = [];
let lastCreates = -1;

/** eventItem is one event as a list item: its time, what happened, and a link to the sandbox (all text). */
export function eventItem(e: SandboxEvent): HTMLElement {
  return el('li', { 'data-event': eventName(e.type) },
    el('time', { datetime: e.timestamp, text: time(e.timestamp) }), ' ',
    el('a', { href: `#/sandbox/${encodeURIComponent(e.sandboxId)}` }, 'sandbox ', el('code', { text: e.sandboxId })),
    ` ${eventName(e.type)}`);
}

/** recentEvents fills list with the newest lifecycle events (or says why there are none). */
async function recentEvents(list: HTMLElement, signal: AbortSignal): Promise<void> {
  let evs: SandboxEvent[];
  try {
    evs = await call<SandboxEvent[]>('/events/sandboxes', { query: { limit: 20 }, signal });
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 404) throw e;
    delete list.dataset.sig;
    clear(list);
    list.appendChild(el('li', { text: `No event feed: ${explain(e)}` }));
    return;
  }
  // Unchanged, the list is left alone (keyboard focus on a link stays).
  const sig = evs.map((e) => e.id).join(',') || 'none';
  if (list.dataset.sig === sig) return;
  list.dataset.sig = sig;
  clear(list);
  for (const e of evs) list.appendChild(eventItem(e));
  if (!evs.length) list.appendChild(el('li', { text: 'none since the node started' }));
}

export function overview(root: HTMLElement, _arg: string, signal: AbortSignal): void {
  const msg = status();
  const counts = el('div', { class: 'cards' });
  const chart = new Chart('Sandboxes and creates over time (sampled by this page)', ['running', 'paused', 'creates'], ['#2a7', '#c80', '#36c']);
  const capacity = el('section', { 'aria-labelledby': 'cap-h' }, el('h2', { id: 'cap-h', text: 'Node capacity' }));
  const capBody = el('div');
  capacity.appendChild(capBody);
  const evList = el('ol', { class: 'events', id: 'recent-events', 'aria-labelledby': 'ev-h' });
  root.append(
    el('h1', { text: 'Overview' }), msg, counts, chart.node,
    capacity,
    el('section', { 'aria-labelledby': 'ev-h' },
      el('h2', { id: 'ev-h', text: 'Recent events' }),
      el('p', { class: 'note', text: 'The newest lifecycle events, newest first (kept in memory by each node since it started).' }),
      evList),
  );
  poll(signal, 3000, async () => {
    const [nodeList, list] = await Promise.all([call<NodeInfo[]>('/nodes'), listSandboxes(), recentEvents(evList, signal)]);
    const running = list.filter((s) => s.state === 'running').length;
    const paused = list.length - running;
    const creates = nodeList.reduce((n, x) => n + (x.createSuccesses ?? 0), 0);
    samples.push({ t: Date.now() / 1000, running, paused, creates: lastCreates < 0 ? 0 : Math.max(0, creates - lastCreates) });
    lastCreates = creates;
    samples.splice(0, Math.max(0, samples.length - 600));
    clear(counts);
    counts.append(
      card('Running', running, 'count-running'), card('Paused', paused, 'count-paused'),
      card('Nodes', nodeList.length, 'count-nodes'), card('Creates (total)', creates, 'count-creates'));
    chart.update(samples.map((s) => s.t), [samples.map((s) => s.running), samples.map((s) => s.paused), samples.map((s) => s.creates)]);
    clear(capBody);
    capBody.appendChild(table(['Node', 'Status', 'CPU allocated', 'Memory allocated', 'Memory used', 'Disk used', 'Sandboxes'],
      nodeList.map((n) => [n.nodeID, n.status, `${n.allocatedCPU} / ${n.cpuCount}`, `${n.allocatedMemoryMB} / ${n.memoryTotalMB} MB`,
        `${n.memoryUsedMB} / ${n.memoryTotalMB} MB`, `${n.diskUsedMB} / ${n.diskTotalMB} MB`, `${n.sandboxes.running} running, ${n.sandboxes.paused} paused`]),
      'Capacity of each node'));
    say(msg, `Updated ${time(new Date().toISOString())}`);
  }, (e) => say(msg, explain(e), true));
}

function card(label: string, value: number, id: string): HTMLElement {
  return el('div', { class: 'card' }, el('span', { class: 'label', text: label }), el('span', { class: 'value', id, text: String(value) }));
}
