import type { Session } from '../db/session.js';
import type { TransformPlan } from './plan.js';

/**
 * Settings for the rest of the transaction: the guard on targets lets this session
 * write (trellis.maintaining names the instance), and expressions resolve names through
 * the search_path the transform was defined with.
 */
export async function enterTransformWork(
  session: Session,
  schema: string,
  plan: TransformPlan,
): Promise<void> {
  await session.query(
    `SELECT set_config('trellis.maintaining', $1, true), set_config('search_path', $2, true)`,
    [schema, plan.searchPath],
  );
}
