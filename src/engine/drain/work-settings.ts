import type { Session } from '../db/session.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import type { ApplyMode } from './apply-choice.js';
import type { TransformPlan } from './plan.js';

/** The transform each session last entered work for (what a drain loop's step was spent on). */
const entered = new WeakMap<Session, number>();

/**
 * Sessions whose transaction entered work to apply changes with JIT already off
 * (enterTransformWork with `applying`): their apply statements need no setting of their own
 * unless they keep the written join order. Every transaction entering transform work sets
 * its session's entry, so none outlives its transaction.
 */
const jitOffForApplying = new WeakMap<Session, boolean>();

/** The transform `session` entered work for since the last call, if any; forgets it. */
export function takeEnteredTransform(session: Session): number | undefined {
  const id = entered.get(session);
  entered.delete(session);
  return id;
}

/**
 * Settings for the rest of the transaction: the guard on targets lets this session
 * write (trellis.maintaining names the instance), expressions resolve names through
 * the search_path the transform was defined with and are evaluated under the settings it
 * was defined with (TimeZone, DateStyle...: ENGINE.md I10, ADR 0033; only those that
 * differ from the session's are set), and statements are planned for their parameters (a
 * generic plan for a "key IN (...)" re-derivation can be orders of magnitude slower; the
 * catalog queries around them keep their cached plans). It also takes the transform's
 * serving lock (shared, to the end of the transaction): other loops see that the
 * transform is being served, and take other transforms' work first (ADR 0045).
 *
 * With `applying` (the transaction applies changes: drain pages, held keys, repairs; or
 * compares a target with its definition over a batch of keys: self-checks), JIT is turned
 * off for the rest of it in the same statement (withApplySettings says why): one setting
 * per transaction, not two round trips per applied range. Builds keep JIT.
 */
export async function enterTransformWork(
  session: Session,
  schema: string,
  plan: TransformPlan,
  applying = false,
): Promise<void> {
  const [row] = await session.query<{ jit_off: boolean }>(
    `SELECT set_config('trellis.maintaining', $1, true), set_config('search_path', $2, true),
            set_config('plan_cache_mode', 'force_custom_plan', true),
            (SELECT count(set_config(s.key, s.value, true)) FROM jsonb_each_text($3::jsonb) s
              WHERE current_setting(s.key) IS DISTINCT FROM s.value),
            pg_advisory_xact_lock_shared($4, hashtext($1 || ':' || $5::int)),
            CASE WHEN $6::boolean
                  AND coalesce(current_setting('trellis.apply_settings', true), '') IS DISTINCT FROM 'off'
                 THEN set_config('jit', 'off', true) = 'off' ELSE false END AS jit_off`,
    [schema, plan.searchPath, plan.settings, LOCK_CLASS.serving, plan.id, applying],
  );
  entered.set(session, plan.id);
  jitOffForApplying.set(session, row?.jit_off === true);
}

/**
 * Whether the statement applying changes to `plan` in `mode` is planned in the join order
 * the engine wrote (ADR 0074; withApplySettings): a GROUP BY over a join whose key map is
 * a shadow, read by group or by delta. Those statements join the sources' shadows, each a UNION ALL of the
 * shadow and the changed rows, restricted by the changed keys (a CTE scan, estimated at one
 * row whatever it holds): left to choose, the planner builds nested loops over whole
 * shadows on the strength of those one-row estimates (TPC-H Q5: seconds per statement,
 * tens of seconds to converge, where the written order takes milliseconds). The whole
 * target recomputed (mode 'recompute') reads the sources themselves, with their
 * statistics, and keeps the planner's choice.
 */
export function keepsWrittenJoinOrder(plan: TransformPlan, mode: ApplyMode): boolean {
  return plan.mapKind === 'shadow' && mode !== 'recompute' && plan.sources.length > 1;
}

/**
 * Runs `run` (one statement applying changes) under the settings such a statement is
 * planned with (ADR 0074), then puts them back as they were (a failure rolls them back
 * with the savepoint the caller holds):
 *
 * - JIT off. The planner cannot see how few rows the changes are (the `changed` CTE), its
 *   cost estimate for a statement of a dozen CTEs passes jit_optimize_above_cost, and
 *   compiling the plan (a thousand functions and more) took 40 s of a 5 s statement in
 *   TPC-H Q18 (the same finding as _wal_append's, 0017).
 * - With `writtenOrder` (keepsWrittenJoinOrder), join_collapse_limit and
 *   from_collapse_limit at 1: the joins are planned in the order the engine wrote them.
 *
 * `trellis.apply_settings = 'off'` (a database or role setting) leaves the planner its own
 * settings: what the bench (`join-order`) compares against.
 */
export async function withApplySettings<T>(
  session: Session,
  writtenOrder: boolean,
  run: () => Promise<T>,
): Promise<T> {
  // JIT is off for the whole transaction already: nothing to set.
  if (!writtenOrder && jitOffForApplying.get(session) === true) return run();
  const [was] = await session.query<{ jit: string; j: string; f: string; apply: boolean }>(
    `WITH s AS MATERIALIZED (
       SELECT current_setting('jit') AS jit, current_setting('join_collapse_limit') AS j,
              current_setting('from_collapse_limit') AS f,
              coalesce(current_setting('trellis.apply_settings', true), '') IS DISTINCT FROM 'off' AS apply)
     SELECT jit, j, f, apply,
            CASE WHEN apply THEN set_config('jit', 'off', true) END AS jit_set,
            CASE WHEN apply AND $1::boolean THEN set_config('join_collapse_limit', '1', true) END AS j_set,
            CASE WHEN apply AND $1::boolean THEN set_config('from_collapse_limit', '1', true) END AS f_set
       FROM s`,
    [writtenOrder],
  );
  if (!was?.apply) return run();
  const result = await run();
  await session.query(
    `SELECT set_config('jit', $1, true),
            set_config('join_collapse_limit', $2, true), set_config('from_collapse_limit', $3, true)`,
    [was.jit, was.j, was.f],
  );
  return result;
}
