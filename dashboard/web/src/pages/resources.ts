// Snapshots, volumes, nodes and webhooks: lists with their actions.
import { ApiError, call, eventName, explain, NodeInfo, Snapshot, Volume, Webhook, WebhookDelivery } from '../api';
import { button, clear, el, field, say, status, table, time } from '../dom';
import { poll } from '../poll';

/** listPage renders a titled, polled list whose rows come from load. */
function listPage(root: HTMLElement, title: string, signal: AbortSignal, load: (msg: HTMLElement, refresh: () => Promise<void>) => Promise<HTMLElement>, intro: Node[] = []): () => Promise<void> {
  const msg = status();
  const box = el('div');
  let shown = '';
  const refresh = async () => {
    const t = await load(msg, refresh);
    const sig = t.textContent ?? '';
    if (sig === shown) return;
    shown = sig;
    clear(box);
    box.appendChild(t);
  };
  root.append(el('h1', { text: title }), ...intro, msg, box);
  poll(signal, 5000, refresh, (e) => say(msg, explain(e), true));
  return refresh;
}

function act(msg: HTMLElement, label: string, what: string, f: () => Promise<unknown>, refresh: () => Promise<void>): HTMLButtonElement {
  return button(label, async () => {
    try {
      await f();
      say(msg, `${what}: done`);
      await refresh();
    } catch (e) {
      say(msg, `${what} failed: ${explain(e)}`, true);
    }
  }, { 'aria-label': what });
}

export function snapshots(root: HTMLElement, _a: string, signal: AbortSignal): void {
  listPage(root, 'Snapshots', signal, async (msg, refresh) => {
    const list = await call<Snapshot[]>('/snapshots', { query: { limit: 100 }, signal });
    return table(['Snapshot', 'Names', 'From sandbox', 'Template', 'Created', 'Layers (memory / rootfs)', 'Repository', ''],
      list.map((s) => [el('code', { text: s.snapshotID }), s.names.join(', '), s.sandboxID, s.templateID, time(s.createdAt),
        `${s.memoryLayers} / ${s.rootfsLayers}`, s.repository ?? '',
        el('div', { class: 'actions' },
          act(msg, 'Create sandbox', `Create a sandbox from ${s.snapshotID}`, () => call('/sandboxes', { method: 'POST', body: { templateID: s.snapshotID } }), refresh),
          act(msg, 'Delete', `Delete snapshot ${s.snapshotID}`, () => call(`/snapshots/${encodeURIComponent(s.snapshotID)}`, { method: 'DELETE' }), refresh))]),
      `${list.length} snapshots (first 100)`);
  });
}

export function volumes(root: HTMLElement, _a: string, signal: AbortSignal): void {
  const name = el('input', { type: 'text', name: 'volumeName', required: true });
  const size = el('input', { type: 'number', name: 'sizeMiB', min: '16', max: '65536', placeholder: 'node default' });
  const form = el('form', { class: 'create', 'aria-label': 'Create a volume' }, field('Name', name), field('Size (MiB)', size), el('button', { type: 'submit' }, 'Create volume'));
  const refresh = listPage(root, 'Volumes', signal, async (msg, refresh) => {
    const list = await call<Volume[]>('/volumes', { signal });
    return table(['Volume', 'Name', 'Size', 'Created', 'Mounted by', ''],
      list.map((v) => [el('code', { text: v.volumeID }), v.name, v.sizeMiB ? `${v.sizeMiB} MiB` : '', time(v.createdAt), (v.mountedBy ?? []).join(', '),
        act(msg, 'Delete', `Delete volume ${v.name}`, () => call(`/volumes/${encodeURIComponent(v.volumeID)}`, { method: 'DELETE' }), refresh)]),
      `${list.length} volumes`);
  }, [form]);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const msg = root.querySelector('.status') as HTMLElement;
    try {
      await call('/volumes', { method: 'POST', body: { name: name.value.trim(), sizeMiB: Number(size.value) || undefined } });
      say(msg, `Created volume ${name.value.trim()}`);
      await refresh();
    } catch (err) {
      say(msg, `Create failed: ${explain(err)}`, true);
    }
  });
}

export function nodes(root: HTMLElement, _a: string, signal: AbortSignal): void {
  listPage(root, 'Nodes', signal, async (msg, refresh) => {
    const list = await call<NodeInfo[]>('/nodes', { signal });
    return table(['Node', 'Status', 'Version', 'VMM', 'CPU (allocated / total)', 'Memory used', 'Disk used', 'Sandboxes', 'Creates (ok / failed)', ''],
      list.map((n) => {
        const id = encodeURIComponent(n.nodeID);
        const next = n.status === 'draining' ? 'ready' : 'draining';
        return [n.nodeID, el('span', { class: `state ${n.status}`, text: n.status }), n.version, `${n.vmm?.driver ?? ''} ${n.vmm?.accel ?? ''}`,
          `${n.allocatedCPU} / ${n.cpuCount}`, `${n.memoryUsedMB} / ${n.memoryTotalMB} MB`, `${n.diskUsedMB} / ${n.diskTotalMB} MB`,
          `${n.sandboxes.running} running, ${n.sandboxes.paused} paused`, `${n.createSuccesses} / ${n.createFailures}`,
          n.status === 'ready' || n.status === 'draining'
            ? act(msg, next === 'draining' ? 'Drain' : 'Undrain', `${next === 'draining' ? 'Drain' : 'Undrain'} ${n.nodeID}`,
              () => call(`/nodes/${id}`, { method: 'POST', body: { status: next } }), refresh)
            : ''];
      }), `${list.length} nodes`);
  });
}

/** deliveries is a webhook's recent delivery attempts as a table (or why they cannot be shown). */
async function deliveries(w: Webhook, signal: AbortSignal): Promise<HTMLElement> {
  const label = w.name || w.id;
  const box = el('section', { class: 'deliveries', 'data-webhook': w.id, 'aria-label': `Deliveries of webhook ${label}` });
  let list: WebhookDelivery[];
  try {
    list = await call<WebhookDelivery[]>(`/events/webhooks/${encodeURIComponent(w.id)}/deliveries`, { signal });
  } catch (e) {
    if (!(e instanceof ApiError) || e.status === 401 || e.status === 0) throw e;
    box.appendChild(el('p', { class: 'note', text: `Deliveries of ${label} cannot be shown: ${explain(e)}` }));
    return box;
  }
  box.appendChild(table(['Time', 'Event', 'Sandbox', 'Attempt', 'Result', 'Outcome'],
    list.map((d) => [el('time', { datetime: d.timestamp, text: time(d.timestamp) }), eventName(d.event), el('code', { text: d.sandboxID }),
      String(d.attempt), d.statusCode ? `HTTP ${d.statusCode}${d.error ? ` (${d.error})` : ''}` : (d.error ?? ''),
      el('span', { class: `outcome ${d.outcome}`, text: d.outcome })]),
    list.length ? `Deliveries of ${label}: the last ${list.length} attempts, newest first` : `Deliveries of ${label}: none yet`));
  return box;
}

export function webhooks(root: HTMLElement, _a: string, signal: AbortSignal): void {
  const url = el('input', { type: 'url', name: 'webhookURL', required: true, placeholder: 'https://…' });
  const name = el('input', { type: 'text', name: 'webhookName' });
  const events = el('input', { type: 'text', name: 'events', value: 'sandbox.lifecycle.created, sandbox.lifecycle.killed' });
  const form = el('form', { class: 'create', 'aria-label': 'Add a webhook' }, field('URL', url), field('Name', name), field('Events (comma-separated)', events),
    el('button', { type: 'submit' }, 'Add webhook'));
  const refresh = listPage(root, 'Webhooks', signal, async (msg, refresh) => {
    const list = await call<Webhook[]>('/events/webhooks', { signal });
    const hooks = table(['Webhook', 'Name', 'URL', 'Events', 'Enabled', 'Created', ''],
      list.map((w) => [el('code', { text: w.id }), w.name, w.url, w.events.join(', '), w.enabled ? 'yes' : 'no', time(w.createdAt),
        el('div', { class: 'actions' },
          act(msg, w.enabled ? 'Disable' : 'Enable', `${w.enabled ? 'Disable' : 'Enable'} webhook ${w.name || w.id}`,
            () => call(`/events/webhooks/${encodeURIComponent(w.id)}`, { method: 'PATCH', body: { enabled: !w.enabled } }), refresh),
          act(msg, 'Delete', `Delete webhook ${w.name || w.id}`, () => call(`/events/webhooks/${encodeURIComponent(w.id)}`, { method: 'DELETE' }), refresh))]),
      `${list.length} webhooks`);
    return el('div', {}, hooks, ...(await Promise.all(list.map((w) => deliveries(w, signal)))));
  }, [el('p', { class: 'note', text: 'Each webhook\'s last 50 delivery attempts are listed below it (kept in memory by the node holding the webhook). ' +
    'Through a cluster gateway, every node\'s webhooks are listed; a webhook is added with a node\'s own API, since each node sends the events of the sandboxes it runs.' })]);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const msg = root.querySelector('.status') as HTMLElement;
    try {
      await call('/events/webhooks', { method: 'POST', body: { url: url.value.trim(), name: name.value.trim() || undefined,
        events: events.value.split(',').map((s) => s.trim()).filter(Boolean), enabled: true } });
      say(msg, 'Webhook added');
      await refresh();
    } catch (err) {
      say(msg, `Adding the webhook failed: ${explain(err)}`, true);
    }
  });
  root.insertBefore(form, root.children[1] ?? null);
}
