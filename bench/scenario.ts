import type { BenchDb } from './support.js';

/** What a figure must reach: its value, or its ratio to the baseline, against a threshold. */
export interface Target {
  of: 'value' | 'ratio';
  op: '>=' | '<=' | '<';
  threshold: number;
  /** As printed, e.g. "≥ 0.90× bare". */
  text: string;
}

/** One measured figure, with the baseline measured beside it in the same run. */
export interface Figure {
  scenario: string;
  figure: string;
  value: number;
  unit: string;
  baseline: { label: string; value: number } | null;
  /** value / baseline. */
  ratio: number | null;
  target: Target | null;
  /** null when the figure has no target (shown for context). */
  met: boolean | null;
  /** Raw samples and anything else worth keeping in the JSON. */
  detail?: Record<string, unknown>;
}

export interface ScenarioContext {
  /** A database of its own, dropped after the scenario. */
  db: BenchDb;
  /** Seconds per throughput measurement (BENCH_SECONDS). */
  seconds: number;
  /** Progress lines (stderr). */
  log(message: string): void;
}

/**
 * A benchmark scenario: one file under bench/, listed in bench/scenarios.ts. `name` is
 * what BENCH_ONLY selects.
 */
export interface Scenario {
  name: string;
  title: string;
  run(context: ScenarioContext): Promise<Figure[]>;
}

export function figure(f: {
  scenario: string;
  figure: string;
  value: number;
  unit: string;
  baseline?: { label: string; value: number };
  target?: Target;
  detail?: Record<string, unknown>;
}): Figure {
  const baseline = f.baseline ?? null;
  const ratio = baseline && baseline.value !== 0 ? f.value / baseline.value : null;
  const target = f.target ?? null;
  let met: boolean | null = null;
  if (target) {
    const x = target.of === 'ratio' ? ratio : f.value;
    met =
      x === null || Number.isNaN(x)
        ? false
        : target.op === '>='
          ? x >= target.threshold
          : target.op === '<='
            ? x <= target.threshold
            : x < target.threshold;
  }
  return {
    scenario: f.scenario,
    figure: f.figure,
    value: f.value,
    unit: f.unit,
    baseline,
    ratio,
    target,
    met,
    ...(f.detail ? { detail: f.detail } : {}),
  };
}
