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
  /** null when the figure has no target (shown for context), or when it is flagged. */
  met: boolean | null;
  /**
   * Its baseline moved more than 15% between runs, and again when re-measured: the ratio
   * is not a result (on a shared machine bare throughput moved 2× between passes).
   */
  flagged?: true;
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
  /**
   * Server settings it needs (a local cluster only; a server of your own keeps its own),
   * e.g. `wal_level = logical` for WAL capture. The cluster runs with those of every
   * chosen scenario.
   */
  server?: Record<string, string | number>;
  run(context: ScenarioContext): Promise<Figure[]>;
}

export function figure(f: {
  scenario: string;
  figure: string;
  value: number;
  unit: string;
  baseline?: { label: string; value: number };
  target?: Target;
  flagged?: boolean;
  detail?: Record<string, unknown>;
}): Figure {
  const baseline = f.baseline ?? null;
  const ratio = baseline && baseline.value !== 0 ? f.value / baseline.value : null;
  const target = f.target ?? null;
  let met: boolean | null = null;
  if (target && !f.flagged) {
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
    ...(f.flagged ? { flagged: true as const } : {}),
    ...(f.detail ? { detail: f.detail } : {}),
  };
}

/**
 * A scenario that failed part way, with the figures it measured before: a long run keeps
 * them (run.ts reports them beside the failure).
 */
export class PartialFailure extends Error {
  constructor(
    readonly figures: Figure[],
    cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = 'PartialFailure';
    if (cause instanceof Error && cause.stack) this.stack = cause.stack;
  }
}

/** What one `npm run bench` found: bench/results/latest.json (format in its README). */
export interface BenchResults {
  /** Dates in the run; ISO strings once read back from the file. */
  startedAt: Date | string;
  finishedAt: Date | string;
  seconds: number;
  commit: string | null;
  engineChanged: boolean | null;
  machine: {
    cores: number;
    cpu: string | null;
    memoryGiB: number;
    os: string;
    node: string;
    /** 1-minute load averages: at the start, at the end, and every 15 s in between. */
    loadAverage: { start: number[]; end: number[]; during?: number[] };
  };
  server: { kind: string; settings: Record<string, string> };
  options: { only: string[] | null; secondsPerMeasurement: number };
  figures: Figure[];
  failures: Array<{ scenario: string; error: string }>;
}
