// Time-series charts (uPlot, drawn on a canvas). Each chart carries a text
// summary for screen readers, since a canvas says nothing.
import uPlot from 'uplot';
import { el } from './dom';

export interface Series { label: string; stroke: string; values: number[] }

export class Chart {
  readonly node: HTMLElement;
  private plot: uPlot | null = null;
  private summary: HTMLElement;

  constructor(private title: string, private series: string[], private colors: string[]) {
    this.summary = el('p', { class: 'sr-only' });
    this.node = el('figure', { class: 'chart', 'aria-label': title },
      el('figcaption', { text: title }), this.summary);
  }

  /** update redraws with times (unix seconds) and one value array per series. */
  update(times: number[], values: number[][]): void {
    const data = [times, ...values] as uPlot.AlignedData;
    const last = values.map((v, i) => `${this.series[i]} ${v.length ? v[v.length - 1] : 'none'}`).join(', ');
    this.summary.textContent = `${this.title}: ${times.length} points; latest ${last}.`;
    this.node.dataset.points = String(times.length);
    this.node.dataset.sums = JSON.stringify(values.map((v) => v.reduce((a, b) => a + b, 0)));
    if (this.plot) {
      this.plot.setData(data);
      return;
    }
    const width = Math.max(300, Math.min(900, (this.node.parentElement?.clientWidth ?? 640) - 24));
    this.plot = new uPlot({
      width, height: 200,
      series: [{}, ...this.series.map((label, i) => ({ label, stroke: this.colors[i], width: 2 }))],
      axes: [{}, {}],
      // One sample spans a minute around it (uPlot would stretch it over years).
      scales: { x: { time: true, range: (_u, min, max) => (min === max ? [min - 60, max + 60] : [min, max]) } },
    }, data, this.node);
  }
}
