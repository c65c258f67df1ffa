// The dashboard's client of the node's (or gateway's) HTTP API: the same
// authenticated API the SDKs use, on this page's own origin. The API key
// is kept in sessionStorage (for this browser tab's session only) and sent
// in the X-API-Key header; it never goes into a URL or a cookie.

const keyName = 'aenv.apiKey';

export function apiKey(): string | null {
  return sessionStorage.getItem(keyName);
}

export function setApiKey(k: string | null): void {
  if (k) sessionStorage.setItem(keyName, k);
  else sessionStorage.removeItem(keyName);
}

/** ApiError carries the status and the API's message (or why it was not reached). */
export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
}

/** explain turns a failed call into a sentence for the user. */
export function explain(err: unknown): string {
  if (err instanceof ApiError) {
    if (err.status === 0) return `Cannot reach the API: ${err.message}`;
    if (err.status === 401) return 'The API key was refused (401): sign in again with the node\'s API key.';
    return `${err.message} (HTTP ${err.status})`;
  }
  return err instanceof Error ? err.message : String(err);
}

export interface CallOptions {
  method?: string;
  body?: unknown;
  query?: Record<string, string | number | undefined>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** key overrides the stored API key ('' sends none: calls to a sandbox's agent). */
  key?: string;
  /** bodyBytes is sent as it is (a Connect frame, a multipart form). */
  bodyBytes?: BodyInit;
}

export async function raw(path: string, o: CallOptions = {}): Promise<Response> {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(o.query ?? {})) {
    if (v !== undefined && v !== '') url.searchParams.set(k, String(v));
  }
  const headers: Record<string, string> = { ...(o.headers ?? {}) };
  const key = o.key ?? apiKey();
  if (key) headers['X-API-Key'] = key;
  let body: BodyInit | undefined = o.bodyBytes;
  if (o.body !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(o.body);
  }
  let resp: Response;
  try {
    resp = await fetch(url, { method: o.method ?? 'GET', headers, body, signal: o.signal, credentials: 'omit', cache: 'no-store' });
  } catch (e) {
    if (e instanceof DOMException && e.name === 'AbortError') throw e;
    throw new ApiError(0, `${o.method ?? 'GET'} ${url.pathname} failed (${e instanceof Error ? e.message : e}); is the server up?`);
  }
  if (!resp.ok) {
    let msg = resp.statusText || 'request failed';
    try {
      const j = await resp.json();
      if (j && typeof j.message === 'string') msg = j.message;
    } catch { /* not JSON */ }
    if (resp.status === 401 && o.key === undefined) onUnauthorized(); // the stored key was refused
    throw new ApiError(resp.status, `${o.method ?? 'GET'} ${url.pathname}: ${msg}`);
  }
  return resp;
}

export async function call<T>(path: string, o: CallOptions = {}): Promise<T> {
  const resp = await raw(path, o);
  if (resp.status === 204) return undefined as T;
  const text = await resp.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

let unauthorized: () => void = () => {};
export function onUnauthorizedCall(f: () => void): void {
  unauthorized = f;
}
function onUnauthorized(): void {
  unauthorized();
}

// Shapes of the API (api/openapi.yaml), the fields the pages use.
export interface ListedSandbox {
  sandboxID: string; templateID: string; alias?: string; startedAt: string; endAt: string;
  cpuCount: number; memoryMB: number; diskSizeMB: number; state: 'running' | 'paused';
  metadata?: Record<string, string>; envdVersion: string;
}
export interface SandboxDetail extends ListedSandbox {
  envdAccessToken?: string; domain?: string; lifecycle?: { autoResume: boolean; onTimeout: string };
}
export interface Sandbox { sandboxID: string; templateID: string; envdAccessToken?: string }
export interface Metric { timestampUnix: number; cpuCount: number; cpuUsedPct: number; memUsed: number; memTotal: number; diskUsed: number; diskTotal: number }
export interface Logs { logs: { timestamp: string; line: string }[] }
export interface Template {
  templateID: string; buildID: string; cpuCount: number; memoryMB: number; diskSizeMB: number; aliases: string[];
  names?: string[]; createdAt: string; updatedAt: string; buildStatus: string; buildCount?: number; spawnCount?: number;
}
export interface BuildInfo { status: string; logs: string[]; logEntries: { timestamp: string; message: string; level: string }[]; reason?: { message?: string } }
export interface Snapshot { snapshotID: string; names: string[]; sandboxID: string; templateID: string; createdAt: string; memoryLayers: number; rootfsLayers: number; repository?: string }
export interface Volume { volumeID: string; name: string; sizeMiB?: number; createdAt?: string; mountedBy?: string[] }
export interface NodeInfo {
  nodeID: string; status: string; version: string; vmm: { driver: string; accel: string }; cpuCount: number;
  memoryTotalMB: number; memoryUsedMB: number; diskTotalMB: number; diskUsedMB: number;
  sandboxes: { running: number; paused: number; total: number }; allocatedCPU: number; allocatedMemoryMB: number;
  createSuccesses: number; createFailures: number;
}
export interface Webhook { id: string; name: string; createdAt: string; enabled: boolean; url: string; events: string[] }
/** SandboxEvent is a lifecycle event of GET /events/sandboxes[/{id}] (E2B's format). */
export interface SandboxEvent { id: string; type: string; sandboxId: string; sandboxTemplateId: string; timestamp: string; eventData?: { sandbox_metadata?: Record<string, string> } }
export interface WebhookDelivery {
  deliveryID: string; webhookID: string; event: string; sandboxID: string; timestamp: string; attempt: number;
  statusCode?: number; error?: string; outcome: 'delivered' | 'retrying' | 'dropped';
}

/** eventName is a lifecycle event's type without its prefix ("paused"). */
export function eventName(type: string): string {
  return type.replace(/^sandbox\.lifecycle\./, '');
}

/** listSandboxes gathers every page of GET /v2/sandboxes (running and paused unless state says). */
export async function listSandboxes(state = 'running,paused', metadata = '', signal?: AbortSignal): Promise<ListedSandbox[]> {
  const out: ListedSandbox[] = [];
  let token = '';
  for (let i = 0; i < 1000; i++) {
    const resp = await raw('/v2/sandboxes', { query: { state, metadata, limit: 100, nextToken: token }, signal });
    out.push(...((await resp.json()) as ListedSandbox[]));
    token = resp.headers.get('X-Next-Token') ?? '';
    if (!token) break;
  }
  return out;
}
