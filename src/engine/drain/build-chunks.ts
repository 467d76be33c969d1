import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { backfillChunkSql, chunkBoundsSql, histogramBoundsSql } from './backfill-sql.js';
import type { TransformPlan } from './plan.js';
import type { PlanCache } from './plan-cache.js';
import { isRowError } from './row-errors.js';
import { enterTransformWork } from './work-settings.js';

/**
 * The chunks of a projection's or join's build, filled by any number of drain loops at
 * once (ADR 0028). The build plans them first (planChunks, under the build's pipeline
 * row lock); each fill then claims one chunk row with FOR UPDATE SKIP LOCKED and deletes
 * it in the transaction that fills it. A fill locks nothing of the build's own but its
 * chunk: not the pipeline row (every fill would then wait for the one before to commit),
 * and it takes no lock stronger than an INSERT's on the target. A fill that dies leaves
 * its chunk for the next loop; one that fails on a row marks its chunk for repair, which
 * the last step does with the target's key back (finishing in backfill.ts).
 */

/** Driving rows per chunk: a transaction each. Small enough that loops share a build evenly. */
export const CHUNK_ROWS = 50_000;

/**
 * A build of at most this many driving rows (its table's row estimate) is filled in one
 * statement, in the transaction that starts it and also puts its key back and moves it on
 * (ADR 0060): no chunk planning, no claims, no commit per chunk, no second step to wait
 * for. Two chunks at most: filling them side by side would save at most one chunk's fill,
 * about what those steps cost (measured: a 40,000-row build 28% sooner, a 100,000-row one
 * the same; at 300,000 rows two loops filling chunks were faster). The custom setting
 * `trellis.one_statement_build_rows` (a database's or role's, read by the drain's
 * sessions) replaces it; 0 fills every build by chunks.
 */
export const ONE_STATEMENT_ROWS = 2 * CHUNK_ROWS;
const ONE_STATEMENT_SETTING = 'trellis.one_statement_build_rows';

interface PlannedChunk {
  lo: string[] | null;
  hi: string[] | null;
  /** Driving rows in it: exact, or from the table's statistics. */
  rows: number;
}

/**
 * Plans the chunks of a build (the target is empty for every one of them) and returns
 * the number of driving rows (an estimate when the bounds came from statistics). A
 * one-column key with statistics takes its bounds from the key's histogram (no read of
 * the table); otherwise one pass over the driving table's key yields every chunk's upper
 * bound and the exact row count. Chunks only need to cover every key once, in order:
 * sizes may be uneven.
 */
export async function planChunks(
  session: Session,
  schema: string,
  plan: TransformPlan,
): Promise<number> {
  const s = quoteIdent(schema);
  const planned = (await boundsFromStatistics(session, plan)) ?? (await exactBounds(session, plan));
  await session.query(`DELETE FROM ${s}.build_chunks WHERE transform_id = $1`, [plan.id]);
  await session.query(
    `INSERT INTO ${s}.build_chunks (transform_id, chunk, lo, hi, rows)
     SELECT $1, c.ord, c.lo, c.hi, c.rows
       FROM ROWS FROM (jsonb_to_recordset($2::jsonb) AS (lo text[], hi text[], rows bigint))
            WITH ORDINALITY AS c(lo, hi, rows, ord)`,
    [plan.id, planned.chunks],
  );
  return planned.total;
}

/** Chunks from consecutive upper bounds; the last chunk is open-ended. */
function fromEnds(ends: string[][], rowsPer: number, total: number): PlannedChunk[] {
  const chunks: PlannedChunk[] = ends.map((hi, i) => ({
    lo: ends[i - 1] ?? null,
    hi,
    rows: rowsPer,
  }));
  chunks.push({
    lo: ends.at(-1) ?? null,
    hi: null,
    rows: Math.max(0, total - rowsPer * ends.length),
  });
  return chunks;
}

async function exactBounds(
  session: Session,
  plan: TransformPlan,
): Promise<{ chunks: PlannedChunk[]; total: number }> {
  const [bounds] = await session.query<{ ends: string[][] | null; total: string | null }>(
    chunkBoundsSql(plan),
    [CHUNK_ROWS],
  );
  const total = Number(bounds?.total ?? 0);
  return { chunks: fromEnds(bounds?.ends ?? [], CHUNK_ROWS, total), total };
}

async function boundsFromStatistics(
  session: Session,
  plan: TransformPlan,
): Promise<{ chunks: PlannedChunk[]; total: number } | null> {
  const driving = plan.sources[0]!;
  if (driving.keyColumns.length !== 1) return null;
  const [stats] = await session.query<{ ends: string[][] | null; rows: number | null }>(
    histogramBoundsSql(plan),
    [driving.table, driving.keyColumns[0]],
  );
  const histogram = stats?.ends ?? [];
  const rows = stats?.rows ?? -1;
  if (histogram.length < 2 || rows <= 0) return null;
  // The bounds split the rows into about equal parts; take every `step`-th as a chunk end.
  const perBound = rows / (histogram.length + 1);
  const step = Math.max(1, Math.round(CHUNK_ROWS / perBound));
  const ends = histogram.filter((_, i) => (i + 1) % step === 0);
  const total = Math.round(rows);
  return { chunks: fromEnds(ends, Math.round(step * perBound), total), total };
}

/**
 * The driving rows of a build about to start, when it is to be filled in one statement
 * (ONE_STATEMENT_ROWS); null when it is to be filled by chunks. The count is the table's
 * row estimate, or exact when the table has none (never analysed: a pass over it, as the
 * chunk planner's would be). A partitioned driving table has no size of its own: counted.
 */
export async function oneStatementRows(
  session: Session,
  plan: TransformPlan,
): Promise<number | null> {
  const driving = plan.sources[0]!;
  // The row estimate scaled to the table's size now, as the planner does: statistics from
  // when the table was a tenth of its size do not make it small.
  const [row] = await session.query<{ limit: string | null; rows: number | null }>(
    `SELECT current_setting($2, true) AS limit,
            CASE WHEN c.reltuples > 0 AND c.relpages > 0
                 THEN c.reltuples / c.relpages
                      * (pg_relation_size(c.oid) / current_setting('block_size')::float8)
                 WHEN c.reltuples > 0 THEN c.reltuples END AS rows
       FROM pg_class c WHERE c.oid = $1::regclass`,
    [driving.table, ONE_STATEMENT_SETTING],
  );
  const set = Number(row?.limit ?? '');
  const limit =
    row?.limit != null && row.limit !== '' && Number.isFinite(set) ? set : ONE_STATEMENT_ROWS;
  if (limit <= 0 || !row) return null;
  let rows = row.rows;
  if (rows === null) {
    // No estimate (never analysed, or a partitioned table's parent): counted, up to one
    // past the limit (a big table is not read whole for this).
    const [counted] = await session.query<{ n: string }>(
      `SELECT count(*) AS n FROM (SELECT FROM ${driving.table} LIMIT $1::bigint + 1) r`,
      [limit],
    );
    rows = Number(counted?.n ?? 0);
  }
  return rows <= limit ? Math.round(rows) : null;
}

/**
 * Fills a whole build in one statement (the chunk fill without bounds), under a savepoint.
 * Returns false when it failed on a row: the build is then filled by chunks, which hold
 * the failing rows and fill the rest. Any other failure is thrown.
 */
export async function fillInOneStatement(
  session: Session,
  plan: TransformPlan,
  log: Logger,
): Promise<boolean> {
  await session.query('SAVEPOINT trellis_one_statement');
  try {
    await session.query(backfillChunkSql(plan), [null, null]);
    await session.query('RELEASE SAVEPOINT trellis_one_statement');
    return true;
  } catch (error) {
    await session.query('ROLLBACK TO SAVEPOINT trellis_one_statement');
    if (!isRowError(error)) throw error;
    log.warn(
      { target: plan.target },
      'the build failed on a row in one statement: it is filled by chunks instead',
    );
    return false;
  }
}

interface ChunkClaim {
  transform_id: number;
  chunk: number;
  lo: string[] | null;
  hi: string[] | null;
  rows: string;
  backend: number;
  claimed_ms: number;
}

/**
 * Claims one chunk of any build and fills it, in one transaction. Returns the chunk's
 * transform and rows filled, or null when no chunk was free. A fill that fails on a row
 * marks its chunk for repair (its rows are left to the build's last step); one that fails
 * for no row's fault throws, with its transform's id, for the caller to record as a build
 * failure (the chunk stays, to be filled again).
 */
export async function fillChunk(
  session: Session,
  schema: string,
  plans: PlanCache,
  log: Logger,
): Promise<{ transformId: number; rows: number } | null> {
  const s = quoteIdent(schema);
  // Progress is not written here: status() counts the chunks left (0023). A fill that
  // wrote the build's pipeline row would hold it to its commit, and every other fill
  // would wait for it.
  return session.transaction(async () => {
    const [claim] = await session.query<ChunkClaim>(
      `SELECT c.transform_id, c.chunk, c.lo, c.hi, c.rows, pg_backend_pid() AS backend,
              (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS claimed_ms
         FROM ${s}.build_chunks c
         JOIN ${s}.pipeline p ON p.transform_id = c.transform_id
         JOIN ${s}.transforms t ON t.id = c.transform_id
         -- Least served first (ADR 0045).
         LEFT JOIN ${s}._drain_ranks() r ON r.transform_id = c.transform_id
        WHERE p.phase = 'backfilling' AND p.backfill_stage = 'chunks' AND NOT c.repair
          AND t.paused_at IS NULL AND (p.build_next_at IS NULL OR p.build_next_at <= now())
        ORDER BY r.serving, r.recent, c.transform_id, c.chunk
        LIMIT 1
          FOR UPDATE OF c SKIP LOCKED`,
    );
    if (!claim) return null;
    const plan = await plans.load(session, claim.transform_id);
    await enterTransformWork(session, schema, plan);
    await session.query('SAVEPOINT trellis_fill');
    try {
      await session.query(backfillChunkSql(plan), [claim.lo, claim.hi]);
      const [done] = await session.query<{ filled_ms: number }>(
        `DELETE FROM ${s}.build_chunks WHERE transform_id = $1 AND chunk = $2
         RETURNING (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS filled_ms`,
        [claim.transform_id, claim.chunk],
      );
      // When the fill ran, by the server's clock (the same for every process): fills of one
      // build whose times overlap ran side by side (test/backfill-parallel.test.ts).
      log.debug(
        {
          target: plan.target,
          chunk: claim.chunk,
          rows: Number(claim.rows),
          backend: claim.backend,
          fromMs: claim.claimed_ms,
          toMs: done?.filled_ms,
        },
        'a build chunk filled',
      );
      return { transformId: claim.transform_id, rows: Number(claim.rows) };
    } catch (error) {
      await session.query('ROLLBACK TO SAVEPOINT trellis_fill');
      if (!isRowError(error)) throw new ChunkFailure(claim.transform_id, claim.chunk, error);
      log.warn(
        { target: plan.target, chunk: claim.chunk },
        'a build chunk failed on a row: it is re-derived key by key at the end of the build',
      );
      await session.query(
        `UPDATE ${s}.build_chunks SET repair = true WHERE transform_id = $1 AND chunk = $2`,
        [claim.transform_id, claim.chunk],
      );
      return { transformId: claim.transform_id, rows: 0 };
    }
  });
}

/** A chunk fill that failed for no row's fault, with the transform it was for. */
export class ChunkFailure extends Error {
  constructor(
    readonly transformId: number,
    readonly chunk: number,
    override readonly cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause));
  }
}

/** The next chunk left for repair (its fill failed on a row), or null when none is. */
export async function nextRepairChunk(
  session: Session,
  schema: string,
  transformId: number,
): Promise<{ chunk: number; lo: string[] | null; hi: string[] | null } | null> {
  const [row] = await session.query<{ chunk: number; lo: string[] | null; hi: string[] | null }>(
    `SELECT chunk, lo, hi FROM ${quoteIdent(schema)}.build_chunks
      WHERE transform_id = $1 AND repair ORDER BY chunk LIMIT 1`,
    [transformId],
  );
  return row ?? null;
}

export async function deleteChunk(
  session: Session,
  schema: string,
  transformId: number,
  chunk: number,
): Promise<void> {
  await session.query(
    `DELETE FROM ${quoteIdent(schema)}.build_chunks WHERE transform_id = $1 AND chunk = $2`,
    [transformId, chunk],
  );
}

/**
 * A chunk whose first `done` rows, up to key `after`, were repaired: it now starts after
 * that key, and holds that many rows fewer (its rows are progress: status() counts the
 * chunks left).
 */
export async function shrinkChunk(
  session: Session,
  schema: string,
  transformId: number,
  chunk: number,
  after: string[],
  done: number,
): Promise<void> {
  await session.query(
    `UPDATE ${quoteIdent(schema)}.build_chunks SET lo = $3::text[], rows = greatest(rows - $4, 0)
      WHERE transform_id = $1 AND chunk = $2`,
    [transformId, chunk, after, done],
  );
}
