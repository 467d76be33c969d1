import type { Session } from '../db/session.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import type { TransformPlan } from './plan.js';

/** The transform each session last entered work for (what a drain loop's step was spent on). */
const entered = new WeakMap<Session, number>();

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
 */
export async function enterTransformWork(
  session: Session,
  schema: string,
  plan: TransformPlan,
): Promise<void> {
  await session.query(
    `SELECT set_config('trellis.maintaining', $1, true), set_config('search_path', $2, true),
            set_config('plan_cache_mode', 'force_custom_plan', true),
            (SELECT count(set_config(s.key, s.value, true)) FROM jsonb_each_text($3::jsonb) s
              WHERE current_setting(s.key) IS DISTINCT FROM s.value),
            pg_advisory_xact_lock_shared($4, hashtext($1 || ':' || $5::int))`,
    [schema, plan.searchPath, plan.settings, LOCK_CLASS.serving, plan.id],
  );
  entered.set(session, plan.id);
}
