import type { Session } from '../db/session.js';
import type { TransformPlan } from './plan.js';

/**
 * Settings for the rest of the transaction: the guard on targets lets this session
 * write (trellis.maintaining names the instance), expressions resolve names through
 * the search_path the transform was defined with and are evaluated under the settings it
 * was defined with (TimeZone, DateStyle...: ENGINE.md I10, ADR 0033; only those that
 * differ from the session's are set), and statements are planned for their parameters (a
 * generic plan for a "key IN (...)" re-derivation can be orders of magnitude slower; the
 * catalog queries around them keep their cached plans).
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
              WHERE current_setting(s.key) IS DISTINCT FROM s.value)`,
    [schema, plan.searchPath, plan.settings],
  );
}
