// The dashboard's shell: sign-in with the API key, navigation, and the
// hash router (#/sandboxes, #/sandbox/<id>, ...) that mounts one page at
// a time. Each page gets an AbortSignal that ends its polling and streams
// when the user leaves it.

import { ApiError, apiKey, call, explain, onUnauthorizedCall, setApiKey } from './api';
import { button, clear, el, field, say, status } from './dom';
import { overview } from './pages/overview';
import { sandboxes } from './pages/sandboxes';
import { sandboxPage } from './pages/sandbox';
import { templates } from './pages/templates';
import { nodes, snapshots, volumes, webhooks } from './pages/resources';

export type Page = (root: HTMLElement, arg: string, signal: AbortSignal) => void | Promise<void>;

const pages: Record<string, { title: string; page: Page; nav: boolean }> = {
  overview: { title: 'Overview', page: overview, nav: true },
  sandboxes: { title: 'Sandboxes', page: sandboxes, nav: true },
  sandbox: { title: 'Sandbox', page: sandboxPage, nav: false },
  templates: { title: 'Templates', page: templates, nav: true },
  snapshots: { title: 'Snapshots', page: snapshots, nav: true },
  volumes: { title: 'Volumes', page: volumes, nav: true },
  nodes: { title: 'Nodes', page: nodes, nav: true },
  webhooks: { title: 'Webhooks', page: webhooks, nav: true },
};

const app = document.getElementById('app')!;
let current: AbortController | null = null;

function signIn(reason = ''): void {
  current?.abort();
  clear(app);
  const key = el('input', { type: 'password', name: 'apiKey', autocomplete: 'off', required: true, spellcheck: 'false' });
  const msg = status();
  if (reason) say(msg, reason, true);
  const form = el('form', { class: 'signin', 'aria-labelledby': 'signin-title' },
    el('h1', { id: 'signin-title', text: 'AgentENV dashboard' }),
    el('p', { text: 'Sign in with the API key of this node (or cluster gateway). It is kept for this browser tab only.' }),
    field('API key', key),
    el('button', { type: 'submit' }, 'Sign in'),
    msg);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    say(msg, 'Checking the key…');
    try {
      await call('/nodes', { key: key.value.trim() });
      setApiKey(key.value.trim());
      if (!location.hash || location.hash === '#/') location.hash = '#/overview';
      render();
    } catch (err) {
      say(msg, err instanceof ApiError && err.status === 401
        ? 'Sign-in failed: the API key was refused (401 invalid or missing X-API-Key).'
        : `Sign-in failed: ${explain(err)}`, true);
    }
  });
  app.appendChild(el('main', { id: 'main' }, form));
  key.focus();
}

function render(): void {
  if (!apiKey()) {
    signIn();
    return;
  }
  current?.abort();
  current = new AbortController();
  const [name, ...rest] = (location.hash.replace(/^#\/?/, '') || 'overview').split('/');
  const entry = pages[name] ?? pages.overview;
  const arg = decodeURIComponent(rest.join('/'));
  clear(app);
  const nav = el('nav', { 'aria-label': 'Pages' },
    el('span', { class: 'brand', text: 'AgentENV' }),
    el('ul', {}, ...Object.entries(pages).filter(([, p]) => p.nav).map(([k, p]) =>
      el('li', {}, el('a', { href: `#/${k}`, 'aria-current': k === name ? 'page' : undefined, text: p.title })))),
    button('Sign out', () => { setApiKey(null); signIn('Signed out.'); }, { class: 'signout' }));
  const main = el('main', { id: 'main', tabindex: '-1' });
  app.append(el('header', {}, nav), main);
  document.title = `${entry.title} · AgentENV`;
  const signal = current.signal;
  Promise.resolve(entry.page(main, arg, signal)).catch((err) => {
    if (signal.aborted) return;
    main.appendChild(el('p', { class: 'status error', role: 'alert', text: explain(err) }));
  });
}

// The skip link moves focus to the page's content (its href would change
// the route).
document.querySelector('.skip')?.addEventListener('click', (e) => {
  e.preventDefault();
  document.getElementById('main')?.focus();
});
onUnauthorizedCall(() => {
  setApiKey(null);
  signIn('The API key was refused (401): sign in again.');
});
window.addEventListener('hashchange', () => {
  render();
  document.getElementById('main')?.focus();
});
render();
