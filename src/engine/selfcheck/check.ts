import type { Session } from '../db/session.js';
import { loadPlan } from '../drain/plan.js';
import { enterTransformWork } from '../drain/work-settings.js';
import { compareBatch, Findings } from './compare-batch.js';
import {
  chunkBoundarySql,
  keyListScope,
  nullGroupsScope,
  rangeScope,
  type Scope,
  WHOLE,
} from './compare-sql.js';
import { type CheckContext, checkTime } from './context.js';
import { repairFindings } from './repair.js';
import { readTail } from './report-tail.js';
import { sampleKeys } from './sample.js';
import { type CheckShape, loadShape } from './shape.js';
import { waitComparable } from './transform-state.js';
import type { SelfCheckMode, SelfCheckReport } from './types.js';

export { CheckStopped } from './context.js';

/** Keys compared per statement (one snapshot each, never held for long). */
export const CHUNK_KEYS = 50_000;

export interface CheckRequest {
  transformId: number;
  mode: SelfCheckMode;
  sample: number;
  maxFindings: number;
  repair: boolean;
}

/**
 * Compares a transform's target with its definition recomputed from the sources (ADR
 * 0015), in chunks of keys, each in one short snapshot (compare-batch.ts): a difference
 * that no change yet to apply routes to is a finding, the others are compared again until
 * they settle, and rows that held keys route to are left out. Then the report: findings,
 * held keys, open drain failures, and, with `repair`, what was re-derived (each chunk's
 * findings are repaired as soon as they are confirmed).
 */
export async function runCheck(ctx: CheckContext, request: CheckRequest): Promise<SelfCheckReport> {
  const { session, schema } = ctx;
  await waitComparable(ctx, request.transformId);
  const plan = await loadPlan(session, schema, request.transformId);
  const shape = await loadShape(session, plan);
  const found = new Findings(request.maxFindings);

  const batch = async (scope: Scope, params: unknown[]) => {
    const confirmed = await compareBatch(ctx, shape, scope, params, found);
    if (request.repair && confirmed.length > 0) {
      found.repaired += await repairFindings(session, schema, plan, shape, confirmed, ctx.log);
    }
    await ctx.progress(found.rowsCompared);
  };

  if (request.mode === 'sample') {
    const keys = await sampleKeys(session, schema, shape, request.sample);
    await ctx.progress(0, keys.count);
    for (const part of keys.batches(CHUNK_KEYS)) await batch(keyListScope(shape), part);
  } else if (shape.kind === 'total') {
    await ctx.progress(0, 1);
    await batch(WHOLE, []);
  } else {
    await ctx.progress(0, await estimateRows(session, shape));
    const boundary = chunkBoundarySql(shape);
    let lo: string[] | null = null;
    for (;;) {
      checkTime(ctx);
      // Keys travel as text between the boundary and the batch: both under the
      // transform's settings (a date key's text depends on DateStyle).
      const rows = await session.transaction(async () => {
        await enterTransformWork(session, schema, plan);
        return session.query<{ upto: string[] }>(boundary, [lo, CHUNK_KEYS]);
      });
      const hi: string[] | null = rows[0]?.upto ?? null;
      await batch(rangeScope(shape), [lo, hi]);
      if (hi === null) break;
      lo = hi;
    }
    if (shape.kind === 'groups' && shape.key.some((k) => k.nullable)) {
      await batch(nullGroupsScope(shape), []);
    }
  }

  const tail = await readTail(session, schema, request.transformId);
  return {
    outcome: found.total > 0 ? 'diverged' : 'consistent',
    divergences: found.listed,
    counts: found.counts,
    rowsCompared: found.rowsCompared,
    truncated: found.total > found.listed.length,
    heldKeys: tail.heldKeys,
    unsettledKeys: found.unsettled,
    skippedColumns: shape.skipped,
    drainFailures: tail.drainFailures,
    repaired: request.repair ? { findings: found.repaired } : null,
  };
}

async function estimateRows(session: Session, shape: CheckShape): Promise<number> {
  const [row] = await session.query<{ n: number }>(
    `SELECT CASE WHEN c.reltuples > 0 THEN c.reltuples::float8
                 ELSE (SELECT count(*) FROM ${shape.plan.targetSql})::float8 END AS n
       FROM pg_class c WHERE c.oid = $1::regclass`,
    [shape.plan.targetSql],
  );
  return Math.round(row?.n ?? 0);
}
