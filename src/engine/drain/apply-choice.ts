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
 * - 'recompute': a GROUP BY's every group is computed in one pass over the sources and
 *   merged into the target in the same transaction (rows that differ written, groups gone
 *   deleted): readers see the target before or after, never half of it, and it stays the
 *   same table (name, grants, indexes, views over it).
 */
export type ApplyMode = 'delta' | 'rederive' | 'recompute';

export interface ApplyChoice {
  mode: ApplyMode;
  /** Why, in a sentence (status().lastApply.reason and the logs). */
  reason: string;
  /** Changed keys in the range (a key changed twice counts twice). */
  keys: number;
}

/**
 * The share of a GROUP BY target's groups a range may touch from which every group is
 * recomputed instead. Re-deriving a group reads its rows through the group index,
 * scattered over the table; a recompute reads the whole table in order and aggregates it
 * by hash, then merges. Measured on 1M rows in 20,000 groups with the index (ADR 0029):
 * re-deriving stays cheaper up to about 20% of the groups, the two meet between 30% and
 * 40%.
 */
export const RECOMPUTE_SHARE = 0.3;

/** Decides how to apply a range of `keys` changed keys for `plan` (see ApplyMode). */
export async function chooseApply(
  session: Session,
  plan: TransformPlan,
  keys: number,
): Promise<ApplyChoice> {
  const rederive = (reason: string): ApplyChoice => ({ mode: 'rederive', reason, keys });
  if (!plan.aggregates) {
    return rederive('each changed key is re-derived through its source key');
  }
  if (plan.delta) {
    return {
      mode: 'delta',
      reason: `each changed row's contribution is applied to its groups (${plan.delta.aggregates.length} aggregates kept by delta)`,
      keys,
    };
  }
  if (plan.groups.length === 0 || !plan.mapSql) {
    return rederive('a grand total is one row, recomputed on any change');
  }
  if (plan.hasHeldKeys) {
    // A held key's row stays out of the target until released: a recompute would read it.
    return rederive('keys are held: only the changed groups are re-derived');
  }
  const [row] = await session.query<{ groups: number }>(
    `SELECT c.reltuples::float8 AS groups FROM pg_class c WHERE c.oid = $1::regclass`,
    [plan.targetSql],
  );
  const groups = row?.groups ?? -1;
  if (groups < 1) return rederive('the number of groups is not known yet (target not analysed)');
  const share = Math.min(keys, groups) / groups;
  const pct = (x: number) => `${(x * 100).toFixed(x < 0.01 ? 2 : 0)}%`;
  const about = `${keys.toLocaleString('en-US')} changed keys may touch up to ${pct(share)} of about ${Math.round(groups).toLocaleString('en-US')} groups`;
  if (share >= RECOMPUTE_SHARE) {
    return {
      mode: 'recompute',
      reason: `${about} (${pct(RECOMPUTE_SHARE)} or more): one pass over the sources costs less than re-deriving each group`,
      keys,
    };
  }
  return rederive(`${about} (under ${pct(RECOMPUTE_SHARE)}): each changed group is re-derived`);
}

/**
 * Records the choice on the transform's pipeline row (status().lastApply), in the
 * transaction that applies the range, and logs it: a recompute at info, a re-derivation
 * (the usual case) at debug.
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
        SET apply_mode = $2, apply_reason = $3, apply_keys = $4, apply_at = now()
      WHERE transform_id = $1`,
    [plan.id, choice.mode, choice.reason, choice.keys],
  );
  const fields = { target: plan.target, mode: choice.mode, keys: choice.keys };
  if (choice.mode === 'recompute') {
    log.info(fields, `${plan.target}: recomputing every group: ${choice.reason}`);
  } else {
    log.debug(fields, `${plan.target}: re-deriving changed keys: ${choice.reason}`);
  }
}
