import type { Figure } from './scenario.js';

function number(value: number, unit: string): string {
  if (!Number.isFinite(value)) return String(value);
  // Small figures keep their decimals (an idle cost of 0.4% of a core is not "0 %").
  const digits = unit === 'ms' ? (value < 100 ? 1 : 0) : value < 10 ? 2 : value < 100 ? 1 : 0;
  return `${value.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits })} ${unit}`;
}

/** The final table, in Markdown (so it pastes into README.md as it is). */
export function table(figures: Figure[]): string {
  const rows = [
    ['scenario', 'figure', 'value', 'baseline', 'ratio', 'target', 'met'],
    ...figures.map((f) => [
      f.scenario,
      f.figure,
      number(f.value, f.unit),
      f.baseline ? `${number(f.baseline.value, f.unit)} (${f.baseline.label})` : '—',
      f.ratio === null ? '—' : `${f.ratio.toFixed(2)}×`,
      f.target?.text ?? '—',
      f.flagged ? 'flagged: baseline moved' : f.met === null ? '—' : f.met ? 'met' : 'NOT met',
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  const line = (r: string[]) => `| ${r.map((c, i) => c.padEnd(widths[i]!)).join(' | ')} |`;
  return [
    line(rows[0]!),
    `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`,
    ...rows.slice(1).map(line),
  ].join('\n');
}
