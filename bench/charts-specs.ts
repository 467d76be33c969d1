import type { TopLevelSpec } from 'vega-lite';
import type { Figure } from './scenario.js';
import { median } from './support.js';

/** A figure of the side-by-side scenario, with what the charts group it by. */
export interface AltFigure extends Figure {
  detail: {
    variant: string;
    label: string;
    workload: string;
    shape: string | null;
    samples: number[];
    baselineSamples?: number[];
    quantiles?: Array<{ q: number; ms: number; sourceMs: number }>;
  } & Record<string, unknown>;
}

const SHAPES: Record<string, string> = { wide: '10,000 groups', hot: '10 hot groups' };
/** Variants top to bottom (bench/alternatives-variants.ts LABELS, bare left out). */
const ORDER = [
  'trellis-pg, trigger capture',
  'trellis-pg, WAL capture',
  'hand-written trigger (synchronous)',
  'REFRESH MATERIALIZED VIEW CONCURRENTLY every 1 s',
  'trellis-pg, trigger capture + drain on the same cores',
  'trellis-pg, WAL capture + drain on the same cores',
];
const COLOURS = ['#4c78a8', '#f58518', '#e45756', '#72b7b2', '#54a24b', '#b279a2'];
// A white background: on GitHub's dark theme a transparent one puts black text on black.
const CONFIG = {
  background: 'white',
  font: 'Helvetica, Arial, sans-serif',
  view: { stroke: null },
  title: { anchor: 'start', subtitleColor: '#555' },
} as const;
const SCHEMA = 'https://vega.github.io/schema/vega-lite/v6.json';
/** Labels are shown whole: vega cuts them at 180 px, and two variants then read the same. */
const LABEL_LIMIT = 1000;

/**
 * Horizontal bars, one per variant and workload, faceted by the aggregate's shape: the
 * figure's ratio to bare (its median over bare's), a dot per run (that run over bare's
 * median), bare's 1 as a grey rule and the figure's target as a dashed red one. A flagged
 * figure (its baseline moved twice) is drawn faded.
 */
export function ratioSpec(
  figures: AltFigure[],
  o: { title: string; about: string; workloads: string[]; axis: string },
): TopLevelSpec {
  const rows: Array<Record<string, unknown>> = [];
  const shapes = new Set<string>();
  for (const f of figures) {
    if (!o.workloads.includes(f.detail.workload) || f.ratio === null) continue;
    const shape = SHAPES[f.detail.shape ?? ''] ?? '';
    shapes.add(shape);
    const base = median(f.detail.baselineSamples ?? []);
    const at = {
      variant: f.detail.label,
      op: f.detail.workload,
      shape,
      flagged: f.flagged === true,
    };
    rows.push({ kind: 'bar', ...at, ratio: f.ratio });
    for (const s of f.detail.samples) rows.push({ kind: 'run', ...at, ratio: s / base });
    if (f.target?.of === 'ratio') rows.push({ kind: 'target', ...at, ratio: f.target.threshold });
  }
  for (const shape of shapes) rows.push({ kind: 'bare', shape, ratio: 1 });
  const y = {
    field: 'variant',
    type: 'nominal',
    sort: ORDER,
    title: null,
    axis: { labelLimit: LABEL_LIMIT },
  } as const;
  const yOffset = { field: 'op', type: 'nominal', sort: o.workloads } as const;
  const x = { field: 'ratio', type: 'quantitative' } as const;
  const only = (kind: string) => [{ filter: `datum.kind === '${kind}'` }];
  const spec: TopLevelSpec = {
    $schema: SCHEMA,
    title: {
      text: o.title,
      subtitle: [
        o.about,
        'Bars: the median of its runs; dots: each run. Grey: bare (1). Dashed red: the target.',
        'Faded: its baseline moved more than 15% twice (flagged: not a result).',
      ],
    },
    data: { values: rows },
    facet: {
      column: { field: 'shape', type: 'nominal', title: null, sort: Object.values(SHAPES) },
    },
    spec: {
      width: 280,
      // Several workloads: a step per bar within a variant's band; one: a step per band.
      height: o.workloads.length > 1 ? { step: 11, for: 'offset' } : { step: 20 },
      layer: [
        {
          transform: only('bar'),
          mark: { type: 'bar' },
          encoding: {
            y,
            yOffset,
            x: { ...x, title: o.axis },
            color: { field: 'op', type: 'nominal', title: null, sort: o.workloads },
            opacity: { condition: { test: 'datum.flagged', value: 0.3 }, value: 0.85 },
          },
        },
        {
          transform: only('bar'),
          mark: { type: 'text', align: 'left', dx: 3, fontSize: 9 },
          encoding: {
            y,
            yOffset,
            x,
            text: { field: 'ratio', type: 'quantitative', format: '.2f' },
          },
        },
        {
          transform: only('run'),
          mark: { type: 'point', filled: true, size: 12, color: 'black', opacity: 0.7 },
          encoding: { y, yOffset, x },
        },
        {
          transform: only('bare'),
          mark: { type: 'rule', color: '#777' },
          encoding: { x },
        },
        {
          transform: only('target'),
          mark: { type: 'rule', strokeDash: [4, 3], color: '#c0392b' },
          encoding: { x },
        },
      ],
    },
    config: CONFIG,
  };
  return spec;
}

/**
 * Commit → visible, as the share of writes visible within x ms (a CDF over every run's
 * lags), per variant, on a log scale (lags under 1 ms drawn at 1 ms); the polling's own
 * floor (visible in the source) in grey, the 250 ms target as a dashed red rule.
 */
export function freshnessSpec(figures: AltFigure[], about: string): TopLevelSpec {
  const rows: Array<Record<string, unknown>> = [];
  const floor = new Map<number, number[]>();
  for (const f of figures) {
    if (!f.detail.quantiles) continue;
    for (const { q, ms, sourceMs } of f.detail.quantiles) {
      rows.push({ variant: f.detail.label, q: q / 100, ms: Math.max(1, ms) });
      floor.set(q, [...(floor.get(q) ?? []), sourceMs]);
    }
  }
  const source = 'visible in the source (what polling adds)';
  for (const [q, values] of floor) {
    rows.push({ variant: source, q: q / 100, ms: Math.max(1, median(values)) });
  }
  const variants = [...ORDER.filter((v) => rows.some((r) => r.variant === v)), source];
  const spec: TopLevelSpec = {
    $schema: SCHEMA,
    title: {
      text: 'Commit → visible in the aggregate at 1,000 single-row INSERTs/s (left is fresher)',
      subtitle: [
        about,
        'Share of writes visible within x ms, every run of each variant; dashed red: the p99 < 250 ms target.',
        "trellis-pg runs its staging worker and two drain loops in the bench process, on the database's cores.",
      ],
    },
    width: 560,
    height: 300,
    layer: [
      {
        data: { values: rows },
        mark: { type: 'line', interpolate: 'step-after', strokeWidth: 2 },
        encoding: {
          x: {
            field: 'ms',
            type: 'quantitative',
            scale: { type: 'log', domainMin: 1 },
            title: 'ms after commit (log scale)',
          },
          y: {
            field: 'q',
            type: 'quantitative',
            title: 'writes visible',
            axis: { format: '%' },
            scale: { domain: [0, 1] },
          },
          color: {
            field: 'variant',
            type: 'nominal',
            // The same colour for a variant in every run; the polling floor in grey.
            scale: {
              domain: variants,
              range: [
                ...variants.slice(0, -1).map((v) => COLOURS[ORDER.indexOf(v)] ?? '#333'),
                '#999',
              ],
            },
            title: null,
            legend: { orient: 'bottom', columns: 1, labelLimit: LABEL_LIMIT },
          },
        },
      },
      {
        data: { values: [{ ms: 250 }] },
        mark: { type: 'rule', strokeDash: [4, 3], color: '#c0392b' },
        encoding: { x: { field: 'ms', type: 'quantitative' } },
      },
    ],
    config: CONFIG,
  };
  return spec;
}

/**
 * Every figure of the run that has a target, from every scenario: how far it is from its
 * target, as the share of the target reached (1 is exactly at it; over 1 is met). A
 * figure "≥ x" scores measured ÷ x, a figure "≤ x" or "< x" scores x ÷ measured, so a bar
 * longer than the rule is always better. Flagged figures are left out (not a result).
 */
export function targetsSpec(figures: Figure[], about: string): TopLevelSpec {
  const rows: Array<Record<string, unknown>> = [];
  for (const f of figures) {
    if (!f.target || f.flagged) continue;
    const measured = f.target.of === 'ratio' ? f.ratio : f.value;
    if (measured === null || measured <= 0) continue;
    const score =
      f.target.op === '>=' ? measured / f.target.threshold : f.target.threshold / measured;
    rows.push({
      figure: `${f.scenario}: ${f.figure}`,
      score,
      met: score >= 1 ? 'met' : 'not met',
      target: f.target.text,
    });
  }
  const y = {
    field: 'figure',
    type: 'nominal',
    title: null,
    sort: null,
    axis: { labelLimit: LABEL_LIMIT },
  } as const;
  const x = { field: 'score', type: 'quantitative', title: 'share of the target reached' } as const;
  return {
    $schema: SCHEMA,
    title: {
      text: 'Every target of the run: the share of it each figure reached (1 = at the target)',
      subtitle: [
        about,
        'Each figure against the baseline measured beside it in the same run; a figure flagged for a moving baseline is left out.',
      ],
    },
    data: { values: rows },
    width: 360,
    height: { step: 14 },
    layer: [
      {
        mark: { type: 'bar' },
        encoding: {
          y,
          x,
          color: {
            field: 'met',
            type: 'nominal',
            title: null,
            scale: { domain: ['met', 'not met'], range: ['#54a24b', '#e45756'] },
          },
          tooltip: [{ field: 'target' }],
        },
      },
      {
        mark: { type: 'text', align: 'left', dx: 3, fontSize: 9 },
        encoding: { y, x, text: { field: 'target' } },
      },
      {
        data: { values: [{ score: 1 }] },
        mark: { type: 'rule', color: '#333' },
        encoding: { x: { field: 'score', type: 'quantitative' } },
      },
    ],
    config: CONFIG,
  };
}
