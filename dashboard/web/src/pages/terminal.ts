// A terminal in the browser over the agent's PTY: process.Process/Start
// with a pty (a login shell, its output streamed back), keystrokes sent
// with SendInput, resizes with Update, as E2B's SDK does for sandbox.pty.
import { Terminal } from '@xterm/xterm';
import { el, say, status } from '../dom';
import { b64, Envd, unb64 } from '../envd';
import { explain } from '../api';

/**
 * adoptStyles carries the <style> elements xterm.js writes (its theme and
 * cell sizes) into constructed style sheets: the page's CSP refuses inline
 * <style> elements, while sheets built through the CSSOM are allowed.
 */
function adoptStyles(root: HTMLElement): MutationObserver {
  const sheets = new Map<HTMLStyleElement, CSSStyleSheet>();
  const sync = () => {
    for (const s of root.querySelectorAll('style')) {
      let sheet = sheets.get(s);
      if (!sheet) {
        sheet = new CSSStyleSheet();
        sheets.set(s, sheet);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
      }
      sheet.replaceSync(s.textContent ?? '');
    }
  };
  const obs = new MutationObserver(sync);
  obs.observe(root, { subtree: true, childList: true, characterData: true });
  sync();
  return obs;
}

export function openTerminal(box: HTMLElement, envd: Envd, signal: AbortSignal): void {
  const msg = status();
  const host = el('div', { class: 'terminal', id: 'terminal', role: 'application', 'aria-label': 'Sandbox terminal' });
  box.append(host, msg);
  const obs = adoptStyles(host);
  const term = new Terminal({ cols: 100, rows: 24, convertEol: false, fontFamily: 'DejaVu Sans Mono, monospace', fontSize: 14, screenReaderMode: true });
  term.open(host);
  const seen: string[] = []; // the terminal's output as text, for tests and assistive tools
  (host as any).aenvOutput = seen;
  let pid = 0;
  const pending: string[] = [];
  const send = (data: string) => {
    if (!pid) {
      pending.push(data);
      return;
    }
    envd.unary('process.Process/SendInput', { process: { pid }, input: { pty: b64(new TextEncoder().encode(data)) } })
      .catch((e) => say(msg, `Input not sent: ${explain(e)}`, true));
  };
  term.onData(send);
  term.onResize(({ cols, rows }) => {
    if (pid) void envd.unary('process.Process/Update', { process: { pid }, pty: { size: { cols, rows } } }).catch(() => {});
  });
  const decoder = new TextDecoder();
  signal.addEventListener('abort', () => {
    obs.disconnect();
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
      for (const d of pending.splice(0)) send(d);
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
