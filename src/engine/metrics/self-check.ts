import { countFor } from './handle-metrics.js';
import { families } from './registry.js';

/** What a finished self-check found, as its metrics count it. */
export interface SelfCheckFindings {
  target: string;
  /** The report's outcome (e.g. whether the target matched its definition). */
  outcome: string;
  /** Rows found diverging, by kind; kinds left out count nothing. */
  divergences?: { missing?: number; extra?: number; differs?: number };
}

/**
 * The hook the self-check jobs call when a check finishes (issue #11): counts it in
 * `trellis_self_checks_total{target, outcome}` and its divergences in
 * `trellis_self_check_divergences_total{target, kind}`, under `instance`
 * (`<database>/<catalog schema>`, the handle's `instance`). Counts nothing when no handle
 * of that instance is open in this process; never throws.
 */
export function recordSelfCheck(instance: string, findings: SelfCheckFindings): void {
  try {
    countFor(instance, families.selfChecks, {
      target: findings.target,
      outcome: findings.outcome,
    });
    for (const kind of ['missing', 'extra', 'differs'] as const) {
      const n = findings.divergences?.[kind] ?? 0;
      countFor(instance, families.selfCheckDivergences, { target: findings.target, kind }, n);
    }
  } catch {
    // Metrics are best effort: a self-check never fails for them.
  }
}
