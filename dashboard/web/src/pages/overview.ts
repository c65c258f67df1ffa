// Overview: running and paused counts and the create rate over time, node
// capacity, recent events. The API has no history of counts and no event
// feed (GET /events/sandboxes is not served), so both are gathered by this
// page while the dashboard is open: counts from GET /nodes every few
// seconds (creates as the change of the nodes' createSuccesses counters),
// events from the changes between two sandbox lists.
import { call, explain, listSandboxes, ListedSandbox, NodeInfo } from '../api';
import { clear, el, say, status, table, time } from '../dom';
import { Chart } from '../chart';
import { poll } from '../poll';

interface Sample { t: number; running: number; paused: number; creates: number }
const samples: Sample[] = [];
let lastCreates = -1;
export const events: { t: Date; text: string }[] = [];
let known: Map<string, string> | null = null;

/** observe records the changes between the last sandbox list seen and this one. */
export function observe(list: ListedSandbox[]): void {
  const now = new Map(list.map((s) => [s.sandboxID, s.state]));
  if (known) {
    for (const [id, st] of now) {
      const was = known.get(id);
      if (!was) events.unshift({ t: new Date(), text: `sandbox ${id} appeared (${st})` });
      else if (was !== st) events.unshift({ t: new Date(), text: `sandbox ${id} ${was} → ${st}` });
    }
    for (const id of known.keys()) if (!now.has(id)) events.unshift({ t: new Date(), text: `sandbox ${id} is gone` });
    events.splice(50);
  }
  known = now;
}

export function overview(root: HTMLElement, _arg: string, signal: AbortSignal): void {
  const msg = status();
  const counts = el('div', { class: 'cards' });
  const chart = new Chart('Sandboxes and creates over time (sampled by this page)', ['running', 'paused', 'creates'], ['#2a7', '#c80', '#36c']);
  const capacity = el('section', { 'aria-labelledby': 'cap-h' }, el('h2', { id: 'cap-h', text: 'Node capacity' }));
  const capBody = el('div');
  capacity.appendChild(capBody);
  const evList = el('ol', { class: 'events' });
  root.append(
    el('h1', { text: 'Overview' }), msg, counts, chart.node,
    capacity,
    el('section', { 'aria-labelledby': 'ev-h' },
      el('h2', { id: 'ev-h', text: 'Recent events' }),
      el('p', { class: 'note', text: 'The API has no event feed: these are the changes this page saw in the sandbox list since the dashboard was opened.' }),
      evList),
  );
  poll(signal, 3000, async () => {
    const [nodeList, list] = await Promise.all([call<NodeInfo[]>('/nodes'), listSandboxes()]);
    observe(list);
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
    clear(evList);
    for (const e of events.slice(0, 20)) evList.appendChild(el('li', {}, el('time', { text: e.t.toLocaleTimeString() }), ' ', e.text));
    if (!events.length) evList.appendChild(el('li', { text: 'none yet' }));
    say(msg, `Updated ${time(new Date().toISOString())}`);
  }, (e) => say(msg, explain(e), true));
}

function card(label: string, value: number, id: string): HTMLElement {
  return el('div', { class: 'card' }, el('span', { class: 'label', text: label }), el('span', { class: 'value', id, text: String(value) }));
}
