// A terminal in the browser over the agent's PTY: process.Process/Start
// with a pty (a login shell, its output streamed back), keystrokes sent
// with SendInput, resizes with Update, as E2B's SDK does for sandbox.pty.
import { Terminal } from '@xterm/xterm';
import { el, say, status } from '../dom';
import { b64, Envd, unb64 } from '../envd';
import { explain } from '../api';

/**
 * inertStyles keeps xterm.js working under the page's CSP, which refuses
 * inline <style> elements: xterm writes its theme and cell sizes into
 * <style> elements it creates (lazily, at any time). From the first
 * terminal on, document.createElement('style') makes an inert
 * <aenv-style> element instead (hidden by the page's style sheet; the
 * dashboard's own code creates no style elements), and the text written
 * into one is applied as a constructed style sheet, which the CSSOM allows
 * and the CSP does not restrict.
 */
let inert = false;
function inertStyles(): void {
  if (inert) return;
  inert = true;
  const create = document.createElement.bind(document);
  (document as any).createElement = (tag: string, o?: ElementCreationOptions) =>
    create(tag.toLowerCase() === 'style' ? 'aenv-style' : tag, o);
  const sheets = new Map<Element, CSSStyleSheet>();
  const sync = () => {
    for (const [e, sheet] of sheets) {
      if (!e.isConnected) {
        sheets.delete(e);
        document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
      }
    }
    for (const e of document.querySelectorAll('aenv-style')) {
      let sheet = sheets.get(e);
      if (!sheet) {
        sheet = new CSSStyleSheet();
        sheets.set(e, sheet);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
      }
      sheet.replaceSync(e.textContent ?? '');
    }
  };
  new MutationObserver(sync).observe(document.body, { subtree: true, childList: true, characterData: true });
}

export function openTerminal(box: HTMLElement, envd: Envd, signal: AbortSignal): void {
  const msg = status();
  const host = el('div', { class: 'terminal', id: 'terminal', role: 'application', 'aria-label': 'Sandbox terminal' });
  box.append(host, msg);
  inertStyles();
  const term = new Terminal({ cols: 100, rows: 24, convertEol: false, fontFamily: 'DejaVu Sans Mono, monospace', fontSize: 14, screenReaderMode: true });
  term.open(host);
  const seen: string[] = []; // the terminal's output as text, for tests and assistive tools
  (host as any).aenvOutput = seen;
  let pid = 0;
  // Keystrokes go one request at a time, in order: what is typed while a
  // request is out is sent together with the next one.
  let queued = '';
  let sending = false;
  const flush = async () => {
    if (sending || !pid || !queued) return;
    sending = true;
    const data = queued;
    queued = '';
    try {
      await envd.unary('process.Process/SendInput', { process: { pid }, input: { pty: b64(new TextEncoder().encode(data)) } });
    } catch (e) {
      say(msg, `Input not sent: ${explain(e)}`, true);
    }
    sending = false;
    void flush();
  };
  const send = (data: string) => {
    queued += data;
    void flush();
  };
  term.onData(send);
  term.onResize(({ cols, rows }) => {
    if (pid) void envd.unary('process.Process/Update', { process: { pid }, pty: { size: { cols, rows } } }).catch(() => {});
  });
  const decoder = new TextDecoder();
  signal.addEventListener('abort', () => {
    term.dispose();
  });
  say(msg, 'Starting a shell…');
  envd.stream('process.Process/Start', {
    process: { cmd: '/bin/bash', args: ['-i', '-l'], envs: { TERM: 'xterm-256color', LANG: 'C.UTF-8' } },
    pty: { size: { cols: term.cols, rows: term.rows } },
  }, (m) => {
    const ev = m.event ?? {};
    if (ev.start) {
      pid = ev.start.pid;
      host.dataset.pid = String(pid);
      say(msg, `Shell started (pid ${pid}).`);
      void flush();
      term.focus();
    } else if (ev.data?.pty) {
      const bytes = unb64(ev.data.pty);
      term.write(bytes);
      seen.push(decoder.decode(bytes, { stream: true }));
      host.dataset.output = seen.join('').slice(-4000);
    } else if (ev.end) {
      say(msg, `The shell ended (${ev.end.status ?? 'exit ' + ev.end.exitCode}).`);
    }
  }, signal).catch((e) => {
    if (!signal.aborted) say(msg, `Terminal: ${explain(e)}`, true);
  });
}
