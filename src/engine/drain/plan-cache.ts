import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import { loadPlan, type TransformPlan } from './plan.js';

/**
 * A drain loop's plans, reloaded only when the catalog says something they depend on
 * changed: the definition (updated_at), paused columns, captured sources, the columns keys
 * are held for. Loading a plan
 * is a few catalog reads; checking it is one small query per unit of work.
 */
export class PlanCache {
  private readonly plans = new Map<number, { version: string; plan: TransformPlan }>();

  constructor(private readonly schema: string) {}

  async load(session: Session, transformId: number): Promise<TransformPlan> {
    const s = quoteIdent(this.schema);
    const [row] = await session.query<{ version: string | null; held: boolean }>(
      `SELECT t.updated_at::text
              || '|' || coalesce((SELECT string_agg(c.name, ',' ORDER BY c.name)
                                    FROM ${s}.transform_columns c
                                   WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL), '')
              || '|' || coalesce((SELECT string_agg(src.id::text, ',' ORDER BY ts.ordinal)
                                    FROM ${s}.transform_sources ts
                                    JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                                   WHERE ts.transform_id = t.id), '')
              || '|' || coalesce((SELECT string_agg(DISTINCT h.column_name, ',')
                                    FROM ${s}.held_keys h
                                   WHERE h.transform_id = t.id AND h.column_name <> ''), '') AS version,
              EXISTS (SELECT 1 FROM ${s}.held_keys h
                       WHERE h.transform_id = t.id AND h.column_name = '') AS held
         FROM ${s}.transforms t WHERE t.id = $1`,
      [transformId],
    );
    const cached = this.plans.get(transformId);
    if (cached && row?.version != null && cached.version === row.version) {
      return { ...cached.plan, hasHeldKeys: row.held };
    }
    const plan = await loadPlan(session, this.schema, transformId);
    if (row?.version != null) this.plans.set(transformId, { version: row.version, plan });
    return plan;
  }
}
