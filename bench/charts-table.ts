import type { AltFigure } from './charts-specs.js';
import { median } from './support.js';

/** Columns of the side-by-side table: which figures, and how a cell reads. */
const COLUMNS: Array<{ title: string; workload: string; shape: string }> = [
  { title: 'INSERT, 10,000 groups', workload: 'INSERT', shape: 'wide' },
  { title: 'UPDATE, 10,000 groups', workload: 'UPDATE', shape: 'wide' },
  { title: 'INSERT, 10 hot groups', workload: 'INSERT', shape: 'hot' },
  { title: 'UPDATE, 10 hot groups', workload: 'UPDATE', shape: 'hot' },
  { title: '100k-row INSERT … SELECT', workload: 'bulk', shape: 'wide' },
  { title: 'freshness p50', workload: 'freshness p50', shape: 'wide' },
  { title: 'freshness p99', workload: 'freshness p99', shape: 'wide' },
];

const n = (x: number, digits = 0) =>
  Number.isFinite(x)
    ? x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits })
    : String(x);

const range = (values: number[], digits: number, unit = '') =>
  values.length > 1
    ? ` (${n(Math.min(...values), digits)}–${n(Math.max(...values), digits)}${unit})`
    : '';

/** A cell: the ratio (or the lag) with the range of its runs, and its target's verdict. */
function cell(f: AltFigure | undefined): string {
  if (!f) return '—';
  const verdict = f.flagged ? ' flagged' : f.met === true ? ' ✓' : f.met === false ? ' **✗**' : '';
  if (f.unit === 'ms' && f.detail.workload.startsWith('freshness')) {
    return `${n(f.value)} ms${range(f.detail.samples, 0)}${verdict}`;
  }
  const base = median(f.detail.baselineSamples ?? []);
  const ratios = f.detail.samples.map((s) => s / base);
  return `${n(f.ratio ?? Number.NaN, 2)}×${range(ratios, 2)}${verdict}`;
}

/** Bare's own figures: its throughput or time, and for freshness what polling sees of the source. */
function bareCell(figures: AltFigure[]): string {
  const f = figures[0];
  if (!f?.baseline) return '—';
  if (f.detail.workload.startsWith('freshness')) return `${n(f.baseline.value)} ms (in the source)`;
  const samples = f.detail.baselineSamples ?? [];
  return `${n(f.baseline.value)} ${f.unit}${range(samples, 0)}${f.detail.baselineMoved ? ', moved' : ''}`;
}

/**
 * The side-by-side table in Markdown: a row per variant, a column per workload. Write
 * figures are ratios to bare (bare's row gives its own figure), freshness is in ms;
 * in parentheses the range over the runs; ✓/✗ whether a target is met.
 */
export function sideBySideTable(figures: AltFigure[]): string {
  const of = (col: (typeof COLUMNS)[number]) =>
    figures.filter((f) => f.detail.workload === col.workload && f.detail.shape === col.shape);
  const labels = [...new Set(figures.map((f) => f.detail.label))];
  const rows = [
    ['', ...COLUMNS.map((c) => c.title)],
    ['bare (nothing reads the table)', ...COLUMNS.map((c) => bareCell(of(c)))],
    ...labels.map((label) => [
      label,
      ...COLUMNS.map((c) => cell(of(c).find((f) => f.detail.label === label))),
    ]),
  ];
  const line = (r: string[]) => `| ${r.join(' | ')} |`;
  return [
    line(rows[0]!),
    `|${rows[0]!.map(() => ' --- ').join('|')}|`,
    ...rows.slice(1).map(line),
  ].join('\n');
}
