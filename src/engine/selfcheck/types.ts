import type { QuarantineCount } from '../catalog/quarantine.js';
import type { DrainFailure } from '../catalog/status-types.js';

/** How much of a target a self-check compares. */
export type SelfCheckMode = 'full' | 'sample';

/** Where a self-check job is. `queued` and `running` are in progress; the rest are final. */
export type SelfCheckState = 'queued' | 'running' | 'done' | 'failed' | 'cancelled';

/** Options of `selfCheck(target, mode, options)`. */
export interface SelfCheckOptions {
  /** For `'sample'`: how many keys to compare, chosen at random across the key space. */
  sample?: number;
  /**
   * At most this many findings are listed in the report (counts stay exact).
   * @defaultValue `100`
   */
  maxFindings?: number;
  /**
   * Re-derive every diverged key through the drain's own path, and say so in the report.
   * @defaultValue `false`
   */
  repair?: boolean;
}

/** A target column whose value differs from the recomputed one, both as text (null: NULL). */
export interface SelfCheckColumnDifference {
  column: string;
  target: string | null;
  recomputed: string | null;
}

/**
 * One thing a self-check found out of step: a row the definition produces and the target
 * lacks (`missing`), one the target has and the definition does not produce (`extra`), or
 * one whose columns differ (`differs`, with each column that does). `key` is the target
 * key rendered as everywhere else (a one-column key's text, a wider key's text[] literal).
 */
export interface SelfCheckFinding {
  kind: 'missing' | 'extra' | 'differs';
  key: string | null;
  columns?: SelfCheckColumnDifference[];
}

/** What a finished self-check found. */
export interface SelfCheckReport {
  outcome: 'consistent' | 'diverged';
  /** The findings, at most `maxFindings` of them, in key order within each chunk compared. */
  divergences: SelfCheckFinding[];
  /** Exact counts of findings by kind, listed or not. */
  counts: { missing: number; extra: number; differs: number };
  /** Keys compared: those of the target and of the recomputed definition, each once. */
  rowsCompared: number;
  /** Whether findings were left out of `divergences` (counts stay exact). */
  truncated: boolean;
  /**
   * The keys the transform holds in quarantine as the check ended. The rows they route to
   * are not compared (their recomputation fails, or their changes are skipped, until
   * released): they are reported here, not as divergences.
   */
  heldKeys: QuarantineCount;
  /**
   * Target keys that kept changing throughout the check, so that each comparison of them
   * found a change not yet applied: neither confirmed nor cleared (not divergences).
   */
  unsettledKeys: number;
  /** Columns not compared: paused ones (their values are left as they are by design). */
  skippedColumns: string[];
  /** Every drain failure open on the transform as the check ended. */
  drainFailures: DrainFailure[];
  /** With `repair`: how many findings' keys were re-derived through the drain's path. */
  repaired: { findings: number } | null;
}

/** A self-check job, as `selfCheck` starts it and `selfCheckJob` reads it back. */
export interface SelfCheckJob {
  id: string;
  target: string;
  mode: SelfCheckMode;
  state: SelfCheckState;
  /** Keys compared so far (advances as the job runs). */
  rowsCompared: number;
  /** Keys the job expects to compare (an estimate for `'full'`), once it has started. */
  rowsTotal: number | null;
  /** Set when `state` is `done`. */
  report: SelfCheckReport | null;
  /** Why it failed or was cancelled. */
  error: string | null;
  createdAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
}
