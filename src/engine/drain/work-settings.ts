import type { Session } from '../db/session.js';
import type { TransformPlan } from './plan.js';

/**
 * Settings for the rest of the transaction: the guard on targets lets this session
 * write (trellis.maintaining names the instance), expressions resolve names through
 * the search_path the transform was defined with, and statements are planned for their
 * parameters (a generic plan for a "key IN (...)" re-derivation can be orders of
 * magnitude slower; the catalog queries around them keep their cached plans).
 */
export async function enterTransformWork(
  session: Session,
  schema: string,
  plan: TransformPlan,
): Promise<void> {
  await session.query(
    `SELECT set_config('trellis.maintaining', $1, true), set_config('search_path', $2, true),
            set_config('plan_cache_mode', 'force_custom_plan', true)`,
    [schema, plan.searchPath],
  );
}
