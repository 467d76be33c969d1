import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';
import { applyKeysBisecting } from './apply-keys.js';
import { loadPlan, type TransformPlan } from './plan.js';
import { backfillChunkSql, chunkEndSql, drivingRowsAfterSql } from './rederive-sql.js';
import { backoffMs, isRowError } from './row-errors.js';
import { enterTransformWork } from './work-settings.js';

/** Driving rows per backfill chunk (one transaction each). */
export const CHUNK_ROWS = 50_000;

/** A build failing this many times in a row for no row's fault pauses the transform. */
export const BUILD_ATTEMPTS_BEFORE_PAUSE = 5;

interface Claim {
  transform_id: number;
  rebuild: boolean;
  backfill_position: string[] | null;
  backfill_done: string;
  build_attempts: number;
}

/**
 * Fills one chunk of a backfilling target, in key order of its FROM table, recording
 * progress with it in the same transaction (so a crash repeats at most the chunk). The
 * last chunk moves the transform on to catching_up. A row that fails is held, as in the
 * drain; a chunk that fails for no row's fault is a build failure: retried with backoff,
 * and after a few attempts the transform pauses. Returns false when nothing was backfilling.
 */
export async function backfillChunk(
  session: Session,
  schema: string,
  log: Logger,
): Promise<boolean> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    const [claim] = await session.query<Claim>(
      `SELECT p.transform_id, p.rebuild, p.backfill_position, p.backfill_done, p.build_attempts
         FROM ${s}.pipeline p JOIN ${s}.transforms t ON t.id = p.transform_id
        WHERE p.phase = 'backfilling' AND t.paused_at IS NULL
          AND (p.build_next_at IS NULL OR p.build_next_at <= now())
        ORDER BY p.updated_at
        LIMIT 1
          FOR UPDATE OF p SKIP LOCKED`,
    );
    if (!claim) return false;
    const plan = await loadPlan(session, schema, claim.transform_id);
    await enterTransformWork(session, schema, plan);
    if (plan.aggregates)
      throw new Error(`backfill of aggregate ${plan.target} is not supported yet`);

    await session.query('SAVEPOINT trellis_chunk');
    try {
      if (claim.rebuild && claim.backfill_position === null) {
        await session.query(`TRUNCATE ${plan.targetSql}`);
      }
      const position = claim.backfill_position;
      const [end] = await session.query<{ upto: string[] }>(chunkEndSql(plan), [
        position,
        CHUNK_ROWS,
      ]);
      const upto = end?.upto ?? null;
      let rows: number;
      try {
        await session.query('SAVEPOINT trellis_fill');
        await session.query(backfillChunkSql(plan), [position, upto]);
        await session.query('RELEASE SAVEPOINT trellis_fill');
      } catch (error) {
        await session.query('ROLLBACK TO SAVEPOINT trellis_fill');
        if (!isRowError(error)) throw error;
        await fillChunkBisecting(session, schema, plan, position, upto, log);
      }
      if (upto) {
        rows = CHUNK_ROWS;
      } else {
        const [after] = await session.query<{ n: string }>(drivingRowsAfterSql(plan), [position]);
        rows = Number(after?.n ?? 0);
      }
      await session.query(
        `UPDATE ${s}.pipeline
            SET backfill_position = $2, backfill_done = backfill_done + $3, rebuild = false,
                backfill_total = greatest(backfill_total, backfill_done + $3),
                phase = CASE WHEN $2::text[] IS NULL THEN 'catching_up' ELSE phase END,
                build_attempts = 0, build_error = NULL, build_next_at = NULL, updated_at = now()
          WHERE transform_id = $1`,
        [claim.transform_id, upto, rows],
      );
      if (!upto) log.info({ target: plan.target }, 'backfill done');
    } catch (error) {
      await session.query('ROLLBACK TO SAVEPOINT trellis_chunk');
      await recordBuildFailure(session, schema, claim, plan, error, log);
    }
    return true;
  });
}

/**
 * A chunk with a row that fails: every driving key of the chunk is re-derived through
 * the drain's bisecting path, so the failing rows are held and the rest filled.
 */
async function fillChunkBisecting(
  session: Session,
  schema: string,
  plan: TransformPlan,
  position: string[] | null,
  upto: string[] | null,
  log: Logger,
): Promise<void> {
  const driving = plan.sources[0]!;
  const keys = driving.keyColumns.map((k) => `d.${quoteIdent(k)}`);
  const bound = (param: string) =>
    driving.keyTypes.map((type, i) => `((${param}::text[])[${i + 1}])::${type}`);
  const tuple = (items: string[]) => (items.length === 1 ? items[0]! : `(${items.join(', ')})`);
  const rows = await session.query<{ k: string[] }>(
    `SELECT ARRAY[${keys.map((k) => `${k}::text`).join(', ')}] AS k FROM ${driving.table} d
      WHERE ($1::text[] IS NULL OR ${tuple(keys)} > ${tuple(bound('$1'))})
        AND ($2::text[] IS NULL OR ${tuple(keys)} <= ${tuple(bound('$2'))})
      ORDER BY ${keys.join(', ')}`,
    [position, upto],
  );
  await applyKeysBisecting(
    session,
    schema,
    plan,
    rows.map((r) => ({ s: driving.sourceId!, k: r.k })),
    log,
  );
}

async function recordBuildFailure(
  session: Session,
  schema: string,
  claim: Claim,
  plan: TransformPlan,
  error: unknown,
  log: Logger,
): Promise<void> {
  const s = quoteIdent(schema);
  const attempts = claim.build_attempts + 1;
  const message = error instanceof Error ? error.message : String(error);
  const pause = attempts >= BUILD_ATTEMPTS_BEFORE_PAUSE;
  await session.query(
    `UPDATE ${s}.pipeline
        SET build_attempts = $2, build_error = $3,
            build_next_at = now() + CASE WHEN $4 THEN interval '0' ELSE make_interval(secs => $5::float8 / 1000) END,
            updated_at = now()
      WHERE transform_id = $1`,
    [claim.transform_id, attempts, message, pause, backoffMs(attempts)],
  );
  if (pause) {
    await session.query(
      `UPDATE ${s}.transforms SET paused_at = now(), pause_reason = 'build_failure', updated_at = now()
        WHERE id = $1 AND paused_at IS NULL`,
      [claim.transform_id],
    );
  }
  log.warn(
    { target: plan.target, attempts, sqlstate: sqlstateOf(error), paused: pause },
    `backfill chunk failed: ${message}`,
  );
}
