import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import type { TransformPlan } from './plan.js';

/**
 * How a ledger range is applied (ADR 0029, ADR 0044):
 * - 'delta': a GROUP BY or grand total whose aggregates all have an exact delta applies
 *   each changed row's contribution to its groups' states (delta-sql.ts): its cost
 *   follows the changed rows, never the groups' sizes;
 * - 'rederive': each changed key's target rows (a GROUP BY: its groups) are re-derived,
 *   reading only their source rows through the sources' indexes;
 * - 'recompute': every group is computed in one pass over the sources and merged into
 *   the target in the same transaction (rows that differ written, groups gone deleted):
 *   readers see the target before or after, never half of it, and it stays the same
 *   table (name, grants, indexes, views over it).
 */
export type ApplyMode = 'delta' | 'rederive' | 'recompute';

/** What applying a range each possible way was estimated to cost, in milliseconds. */
export interface ApplyEstimate {
  /** The estimate of the way chosen. */
  ms: number;
  /** Each way considered. */
  alternatives: Partial<Record<ApplyMode, number>>;
  /** Whether the estimates use this transform's measured costs (else the defaults). */
  measured: boolean;
}

export interface ApplyChoice {
  mode: ApplyMode;
  /** Why, in a sentence (status().lastApply.reason and the logs). */
  reason: string;
  /** Changed keys in the range (a key changed twice counts twice). */
  keys: number;
  /** null when there was nothing to weigh (a projection, a join, a grand total's one row...). */
  estimate: ApplyEstimate | null;
}

/**
 * Costs per unit, in milliseconds, measured on the 2-core machine (ADR 0044): before a
 * transform has applied a range big enough to be measured, its estimates use these.
 * - delta: per changed key (its key-map rows replaced, its groups' states and target rows
 *   written; a rescan now and then);
 * - rederive: per changed key, plus each touched group's rows read through an index;
 * - recompute: per source row (one sequential pass, hash aggregate; for delta the key map
 *   written again), plus per group merged into the target.
 */
export const DEFAULT_COSTS = {
  delta: 0.08,
  rederive: 0.35,
  groupRowRead: 0.005,
  recompute: 0.006,
  deltaRecompute: 0.012,
  mergeGroup: 0.004,
} as const;

/** Ranges with fewer changed keys than this are not measured: a statement's fixed cost would dominate. */
export const MEASURE_FROM_KEYS = 500;

/** Weight of a new measurement in a transform's running costs (exponential moving average). */
const MEASURE_WEIGHT = 0.3;

/** A transform's measured costs per unit (pipeline.apply_costs), in milliseconds. */
export interface MeasuredCosts {
  /** Per changed key, by delta. */
  delta?: number;
  /** Per changed key, by re-derivation (its groups' rows included). */
  rederive?: number;
  /** Per source row, by recompute. */
  recompute?: number;
}

/**
 * Decides how to apply a range of `keys` changed keys for `plan`: the cheapest way by
 * estimate. A projection or join is always re-derived (one index probe per key either
 * way); a GROUP BY weighs delta (when its aggregates allow it) or re-derivation against a
 * recompute, from the source's and target's sizes (pg_class) and what each way has cost
 * this transform before (`apply_costs`), so a burst is never applied much slower than a
 * recompute in the same conditions.
 */
export async function chooseApply(
  session: Session,
  schema: string,
  plan: TransformPlan,
  keys: number,
): Promise<ApplyChoice> {
  const fixed = (mode: ApplyMode, reason: string): ApplyChoice => ({
    mode,
    reason,
    keys,
    estimate: null,
  });
  if (!plan.aggregates) {
    return fixed('rederive', 'each changed key is re-derived through its source key');
  }
  if (!plan.delta && (plan.groups.length === 0 || !plan.mapSql)) {
    return fixed('rederive', 'a grand total is one row, recomputed on any change');
  }
  const byDelta = plan.delta !== null;
  const incremental: ApplyMode = byDelta ? 'delta' : 'rederive';
  if (plan.hasHeldKeys) {
    // A held key's row stays out of the target until released: a recompute would read it.
    return fixed(incremental, 'keys are held: only the changed rows are applied');
  }
  const [row] = await session.query<{ rows: number; groups: number; costs: MeasuredCosts | null }>(
    `SELECT (SELECT c.reltuples::float8 FROM pg_class c WHERE c.oid = $1::regclass) AS rows,
            (SELECT c.reltuples::float8 FROM pg_class c WHERE c.oid = $2::regclass) AS groups,
            (SELECT p.apply_costs FROM ${quoteIdent(schema)}.pipeline p WHERE p.transform_id = $3) AS costs`,
    [plan.sources[0]!.table, byDelta ? plan.delta!.statesSql : plan.targetSql, plan.id],
  );
  const rows = row?.rows ?? -1;
  const groups = Math.max(row?.groups ?? -1, plan.groups.length === 0 ? 1 : -1);
  if (rows < 1 || groups < 1) {
    return fixed(
      incremental,
      'the sizes of the source and target are not known yet (not analysed)',
    );
  }
  const estimate = estimateCosts(plan, keys, rows, groups, row?.costs ?? null);
  const mode: ApplyMode =
    (estimate.alternatives.recompute ?? Number.POSITIVE_INFINITY) < estimate.ms
      ? 'recompute'
      : incremental;
  const chosen = { ...estimate, ms: estimate.alternatives[mode]! };
  const ms = (x: number | undefined) => `${Math.round(x ?? 0).toLocaleString('en-US')} ms`;
  const about = `${keys.toLocaleString('en-US')} changed keys over about ${Math.round(rows).toLocaleString('en-US')} source rows in ${Math.round(groups).toLocaleString('en-US')} groups`;
  const other = mode === 'recompute' ? incremental : 'recompute';
  const how = estimate.measured ? 'measured on this transform' : 'default';
  return {
    mode,
    reason: `${about}: ${mode} estimated at ${ms(chosen.ms)}, ${other} at ${ms(estimate.alternatives[other])} (${how} costs)`,
    keys,
    estimate: chosen,
  };
}

/**
 * Estimated milliseconds of each way (`ms` is the incremental way's: delta or rederive).
 * A changed key touches at most two groups (its old and new), of rows/groups rows each.
 */
export function estimateCosts(
  plan: TransformPlan,
  keys: number,
  rows: number,
  groups: number,
  costs: MeasuredCosts | null,
): ApplyEstimate {
  const byDelta = plan.delta !== null;
  const recomputePerRow =
    costs?.recompute ?? (byDelta ? DEFAULT_COSTS.deltaRecompute : DEFAULT_COSTS.recompute);
  const recompute = rows * recomputePerRow + groups * DEFAULT_COSTS.mergeGroup;
  let incremental: number;
  if (byDelta) {
    incremental = keys * (costs?.delta ?? DEFAULT_COSTS.delta);
  } else if (costs?.rederive !== undefined) {
    incremental = keys * costs.rederive;
  } else {
    const touched = Math.min(2 * keys, groups);
    incremental =
      keys * DEFAULT_COSTS.rederive + touched * (rows / groups) * DEFAULT_COSTS.groupRowRead;
  }
  const mode: ApplyMode = byDelta ? 'delta' : 'rederive';
  return {
    ms: incremental,
    alternatives: { [mode]: incremental, recompute },
    measured: costs !== null && (byDelta ? costs.delta : costs.rederive) !== undefined,
  };
}

/**
 * Records the choice on the transform's pipeline row (status().lastApply), in the
 * transaction that applies the range, and logs it: a recompute at info, the incremental
 * ways (the usual case) at debug.
 */
export async function recordChoice(
  session: Session,
  schema: string,
  plan: TransformPlan,
  choice: ApplyChoice,
  log: Logger,
): Promise<void> {
  await session.query(
    `UPDATE ${quoteIdent(schema)}.pipeline
        SET apply_mode = $2, apply_reason = $3, apply_keys = $4, apply_at = now(),
            apply_estimate = $5::jsonb
      WHERE transform_id = $1`,
    [plan.id, choice.mode, choice.reason, choice.keys, choice.estimate],
  );
  const fields = {
    target: plan.target,
    mode: choice.mode,
    keys: choice.keys,
    ...(choice.estimate ? { estimate_ms: Math.round(choice.estimate.ms) } : {}),
  };
  if (choice.mode === 'recompute') {
    log.info(fields, `${plan.target}: recomputing every group: ${choice.reason}`);
  } else {
    log.debug(fields, `${plan.target}: applying changed keys (${choice.mode}): ${choice.reason}`);
  }
}

/**
 * Adds what applying `keys` changed keys `mode`'s way took (`ms`) to the transform's
 * measured costs, which later choices weigh (an exponential moving average per unit: per
 * key for delta and rederive, per source row for recompute). Small ranges are not
 * measured: their fixed cost would make keys look dear.
 */
export async function recordCost(
  session: Session,
  schema: string,
  plan: TransformPlan,
  mode: ApplyMode,
  keys: number,
  ms: number,
): Promise<void> {
  if (!plan.aggregates || (mode !== 'recompute' && keys < MEASURE_FROM_KEYS)) return;
  await session.query(
    `UPDATE ${quoteIdent(schema)}.pipeline p
        SET apply_costs = coalesce(p.apply_costs, '{}') || jsonb_build_object($2::text,
              round((coalesce((p.apply_costs->>$2::text)::float8 * (1 - $4::float8), 0)
                     + $3::float8 * CASE WHEN p.apply_costs ? $2::text THEN $4::float8 ELSE 1 END)::numeric, 6))
       WHERE p.transform_id = $1`,
    [
      plan.id,
      mode,
      mode === 'recompute' ? ms / (await sourceRows(session, plan)) : ms / keys,
      MEASURE_WEIGHT,
    ],
  );
}

async function sourceRows(session: Session, plan: TransformPlan): Promise<number> {
  const [row] = await session.query<{ rows: number }>(
    `SELECT greatest(c.reltuples::float8, 1) AS rows FROM pg_class c WHERE c.oid = $1::regclass`,
    [plan.sources[0]!.table],
  );
  return row?.rows ?? 1;
}
