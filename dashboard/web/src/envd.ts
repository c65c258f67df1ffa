// A client of a sandbox's agent (E2B's envd protocol), reached the way
// E2B's SDKs reach it with a sandbox URL: requests to this page's origin
// carrying E2b-Sandbox-Id and E2b-Sandbox-Port, which the node (or the
// gateway) hands to its sandbox proxy. The agent's RPCs are Connect
// services spoken here in their JSON encoding; files go over /files.

import { call, raw } from './api';

const agentPort = 49983;
const user = 'user';

export class Envd {
  constructor(private id: string, private token?: string) {}

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    const h: Record<string, string> = {
      'E2b-Sandbox-Id': this.id,
      'E2b-Sandbox-Port': String(agentPort),
      Authorization: 'Basic ' + btoa(user + ':'),
      ...extra,
    };
    if (this.token) h['X-Access-Token'] = this.token;
    return h;
  }

  /** unary calls a Connect unary RPC with a JSON body. */
  unary<T>(method: string, body: unknown): Promise<T> {
    return call<T>('/' + method, { method: 'POST', body, key: '', headers: this.headers({ 'Connect-Protocol-Version': '1' }) });
  }

  /** stream calls a Connect server-streaming RPC and hands each message to onMessage. */
  async stream(method: string, body: unknown, onMessage: (m: any) => void, signal: AbortSignal): Promise<void> {
    const json = new TextEncoder().encode(JSON.stringify(body));
    const frame = new Uint8Array(5 + json.length);
    new DataView(frame.buffer).setUint32(1, json.length);
    frame.set(json, 5);
    const resp = await raw('/' + method, {
      method: 'POST', key: '', signal,
      headers: this.headers({ 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' }),
      bodyBytes: frame,
    });
    const reader = resp.body!.getReader();
    let buf = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const next = new Uint8Array(buf.length + value.length);
      next.set(buf);
      next.set(value, buf.length);
      buf = next;
      while (buf.length >= 5) {
        const flags = buf[0];
        const len = new DataView(buf.buffer, buf.byteOffset + 1, 4).getUint32(0);
        if (buf.length < 5 + len) break;
        const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + len)));
        buf = buf.slice(5 + len);
        if (flags & 2) { // end of stream: an error, if any
          if (msg.error) throw new Error(`${method}: ${msg.error.code}: ${msg.error.message ?? ''}`);
          return;
        }
        onMessage(msg);
      }
    }
  }

  listDir(path: string): Promise<{ entries?: Entry[] }> {
    return this.unary('filesystem.Filesystem/ListDir', { path, depth: 1 });
  }

  async upload(path: string, file: Blob): Promise<void> {
    const form = new FormData();
    form.append('file', file);
    await raw('/files', { method: 'POST', key: '', query: { path, username: user }, headers: this.headers(), bodyBytes: form });
  }

  async download(path: string): Promise<Blob> {
    const resp = await raw('/files', { key: '', query: { path, username: user }, headers: this.headers() });
    return resp.blob();
  }
}

export interface Entry { name: string; type: string; path: string; size?: string | number; permissions?: string; modifiedTime?: string }

export function b64(bytes: Uint8Array): string {
  let s = '';
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

export function unb64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
