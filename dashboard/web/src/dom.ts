// DOM helpers. Text is only ever set with textContent: nothing that comes
// from the API or a sandbox (names, metadata, logs, file names, output) is
// parsed as HTML anywhere in the dashboard.

export type Child = Node | string | number | null | undefined | false;
export type Attrs = Record<string, string | number | boolean | undefined | ((e: Event) => void)>;

/** el creates an element; attributes starting with "on" are listeners. */
export function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (typeof v === 'function') {
      e.addEventListener(k.slice(2), v as EventListener);
    } else if (k === 'text') {
      e.textContent = String(v);
    } else {
      e.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(e, ...children);
  return e;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    parent.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
}

export function clear(e: Node): void {
  while (e.firstChild) e.removeChild(e.firstChild);
}

let fieldSeq = 0;

/** field is a labelled input (the label names it for assistive technology). */
export function field(label: string, input: HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement): HTMLElement {
  if (!input.id) input.id = `f${++fieldSeq}`;
  return el('div', { class: 'field' }, el('label', { for: input.id, text: label }), input);
}

export function button(label: string, onclick: (e: Event) => void, attrs: Attrs = {}): HTMLButtonElement {
  return el('button', { type: 'button', ...attrs, onclick }, label);
}

export function table(headers: string[], rows: Child[][], caption: string): HTMLTableElement {
  return el('table', {},
    el('caption', { text: caption }),
    el('thead', {}, el('tr', {}, ...headers.map((h) => el('th', { scope: 'col', text: h })))),
    el('tbody', {}, ...rows.map((r) => el('tr', {}, ...r.map((c) => el('td', {}, c))))),
  );
}

/** status is a live region for results and errors of actions. */
export function status(): HTMLElement {
  return el('p', { class: 'status', role: 'status', 'aria-live': 'polite' });
}

export function say(target: HTMLElement, msg: string, isError = false): void {
  target.textContent = msg;
  target.classList.toggle('error', isError);
}

export function time(s?: string): string {
  if (!s) return '';
  const d = new Date(s);
  return isNaN(d.getTime()) ? s : d.toLocaleString();
}
