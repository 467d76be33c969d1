import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';
import { groupsFillSql } from './aggregate-sql.js';
import { analyzeBuilt } from './analyze-built.js';
import { applyKeysBisecting, newBisection, summarize } from './apply-keys.js';
import { chunkEndSql, drivingRowsAfterSql } from './backfill-sql.js';
import {
  ChunkFailure,
  deleteChunk,
  fillChunk,
  fillInOneStatement,
  nextRepairChunk,
  oneStatementRows,
  planChunks,
  shrinkChunk,
} from './build-chunks.js';
import { deltaFillStatements } from './delta-sql.js';
import { loadPlan, type TransformPlan } from './plan.js';
import type { PlanCache } from './plan-cache.js';
import { emptyKeyState, rederiveWhole } from './rebuild-merge.js';
import { backoffMs, isRowError } from './row-errors.js';
import { typedParam } from './sql-parts.js';
import { enterTransformWork } from './work-settings.js';

/** Driving keys per chunk of a GROUP BY build's repair (one transaction each). */
export const REPAIR_ROWS = 50_000;

/**
 * A chunk's repair re-derives its keys in slices of this many, in one transaction while
 * few of them fail; once a step has held REPAIR_STEP_HELD keys (or run REPAIR_STEP_MS) it
 * commits, and the next step takes the rest of the chunk. A flood of failing rows then
 * shows in status() (held keys, progress) as it is found, and a chunk with a bad row or
 * two is still repaired in one go.
 */
export const REPAIR_SLICE_KEYS = 250;
const REPAIR_STEP_HELD = 25;
const REPAIR_STEP_MS = 2_000;

/** A build failing this many times in a row for no row's fault pauses the transform. */
export const BUILD_ATTEMPTS_BEFORE_PAUSE = 5;

interface Claim {
  transform_id: number;
  rebuild: boolean;
  backfill_position: string[] | null;
  backfill_stage: 'rows' | 'chunks' | 'groups' | 'repair';
  backfill_done: string;
  build_attempts: number;
}

/** What one chunk did: where the next starts (null: the stage is done) and how many driving rows it covered. */
interface Step {
  upto: string[] | null;
  rows: number;
}

/**
 * One step of a build, if any target is building: a chunk filled, or a build step that
 * needs the build's pipeline row. Returns false when nothing was building. See
 * buildStep and build-chunks.ts.
 */
export async function backfillChunk(
  session: Session,
  schema: string,
  plans: PlanCache,
  log: Logger,
): Promise<boolean> {
  try {
    if (await fillChunk(session, schema, plans, log)) return true;
  } catch (error) {
    if (!(error instanceof ChunkFailure)) throw error;
    const s = quoteIdent(schema);
    await session.transaction(async () => {
      // Counted against the build it happened in, once: not when the build was started
      // over or moved on meanwhile, nor when another loop's fill, failing at the same
      // time (a full disk fails them all), already counted one and set the backoff.
      const [claim] = await session.query<Claim & { backing_off: boolean }>(
        `SELECT transform_id, build_attempts, coalesce(build_next_at > now(), false) AS backing_off
           FROM ${s}.pipeline
          WHERE transform_id = $1 AND phase = 'backfilling' AND backfill_stage = 'chunks'
            FOR UPDATE`,
        [error.transformId],
      );
      if (!claim || claim.backing_off) return;
      // Asked under the lock, in a statement of its own (its snapshot sees a fill that
      // committed meanwhile): the chunk is still to fill.
      const [left] = await session.query(
        `SELECT 1 FROM ${s}.build_chunks WHERE transform_id = $1 AND chunk = $2`,
        [error.transformId, error.chunk],
      );
      if (!left) return;
      const plan = await loadPlan(session, schema, error.transformId);
      await recordBuildFailure(session, schema, claim, plan, error.cause, log);
    });
    return true;
  }
  return buildStep(session, schema, log);
}

/**
 * A build step that holds the build's pipeline row, recording progress with it in the
 * same transaction (so a crash repeats at most the step). Stages:
 * - 'rows' (projections, filters, joins): a driving table of at most ONE_STATEMENT_ROWS
 *   is filled in one statement and the build finished in this same step (ADR 0060);
 *   otherwise (or when that statement fails on a row) plans the chunks, in key order of
 *   the FROM (driving) table, that any drain loop then fills ('chunks', build-chunks.ts);
 * - 'chunks', once no chunk is left to fill: re-derives, one per step, the chunks whose
 *   fill failed on a row (through the drain's bisecting path, so the failing rows are
 *   held), then puts the target's key back and moves on;
 * - 'groups' (GROUP BY, and grand totals): every group at once, as one aggregate query,
 *   with the key map filled in the same statement (see groupsFillSql).
 * - 'repair': when that query fails on a row, the groups are re-derived instead by chunks
 *   of driving keys through the drain's bisecting path, so the failing rows are held.
 * The last step moves the transform on to catching_up. A step that fails for no row's
 * fault is a build failure: retried with backoff, and after a few attempts the transform
 * pauses.
 */
async function buildStep(session: Session, schema: string, log: Logger): Promise<boolean> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    // A 'chunks' build is claimed only once every chunk is filled or left for repair: a
    // chunk being filled is still there (its delete not yet committed).
    const [claim] = await session.query<Claim>(
      `SELECT p.transform_id, p.rebuild, p.backfill_position, p.backfill_stage, p.backfill_done,
              p.build_attempts
         FROM ${s}.pipeline p JOIN ${s}.transforms t ON t.id = p.transform_id
         -- Least served first (ADR 0045).
         LEFT JOIN ${s}._drain_ranks() r ON r.transform_id = p.transform_id
        WHERE p.phase = 'backfilling' AND t.paused_at IS NULL
          AND (p.build_next_at IS NULL OR p.build_next_at <= now())
          AND (p.backfill_stage <> 'chunks'
               OR NOT EXISTS (SELECT 1 FROM ${s}.build_chunks c
                               WHERE c.transform_id = p.transform_id AND NOT c.repair))
        ORDER BY r.serving, r.recent, p.updated_at
        LIMIT 1
          FOR UPDATE OF p SKIP LOCKED`,
    );
    if (!claim) return false;
    if (claim.backfill_stage === 'chunks' && (await chunksLeftToFill(session, schema, claim))) {
      return false;
    }
    let plan = await loadPlan(session, schema, claim.transform_id);
    await enterTransformWork(session, schema, plan);

    await session.query('SAVEPOINT trellis_chunk');
    try {
      const starting = claim.backfill_position === null && claim.backfill_stage === 'rows';
      if (starting && plan.classification?.pending) {
        // Defined before aggregates were kept by delta: switched now that it is rebuilt.
        await session.query(`SELECT ${s}._switch_to_delta($1)`, [plan.id]);
        plan = await loadPlan(session, schema, claim.transform_id);
      }
      // A build an older version was filling chunk after chunk (its position set) starts
      // over: its chunks are planned from the start.
      const olderBuild = claim.backfill_position !== null && claim.backfill_stage === 'rows';
      // A rebuild never empties the target with TRUNCATE, which is not MVCC-safe (a
      // repeatable-read reader whose snapshot came before it would read the target empty),
      // and never takes ACCESS EXCLUSIVE on it (ADR 0076): a target with rows is computed
      // whole and merged in this one transaction (readers see the old rows, then the new);
      // otherwise, or when that fails on a row, it is emptied with DELETE and built as
      // usual (readers whose snapshot came before still read the old rows).
      let merged: number | null = null;
      const rebuilding = (starting && claim.rebuild) || olderBuild;
      if (rebuilding) {
        merged = olderBuild ? null : await rebuildByMerge(session, schema, plan, log);
        if (merged === null) {
          await session.query(`DELETE FROM ${plan.targetSql}`);
          await emptyKeyState(session, plan);
        }
      }
      // A target being rebuilt keeps its indexes (dropping them would take ACCESS EXCLUSIVE
      // and wait for, then block, its readers).
      if (starting && !rebuilding && Number(claim.backfill_done) === 0) {
        await deferIndexes(session, schema, claim.transform_id, plan);
      }
      let stage = claim.backfill_stage;
      // An aggregate's target (and key map) is filled in one statement: see groupsFillSql.
      if (stage === 'rows' && plan.aggregates) stage = 'groups';
      let step: Step = { upto: null, rows: 0 };
      let next: Claim['backfill_stage'] = stage;
      let done = false;
      // The transform paused at quarantineThreshold during this step: its progress stays
      // where it was (RESUME takes the build up again), with the keys held so far.
      let stopped = false;
      let total: number | null = null;
      if (merged !== null) {
        log.debug({ target: plan.target, rows: merged }, 'a rebuild merged in one transaction');
        total = merged;
        step = { upto: null, rows: merged };
        done = true;
      } else if (stage === 'rows') {
        // Small enough: filled whole in this step, which then finishes the build (ADR 0060).
        const rows = await oneStatementRows(session, plan);
        if (rows !== null && (await fillInOneStatement(session, plan, log))) {
          log.debug({ target: plan.target, rows }, 'a build filled in one statement');
          total = rows;
          done = true;
        } else {
          total = await planChunks(session, schema, plan);
          next = 'chunks';
        }
      } else if (stage === 'chunks') {
        const repair = await nextRepairChunk(session, schema, plan.id);
        if (repair) {
          // Re-derivation upserts: it needs the key back.
          await restoreIndexes(session, schema, claim.transform_id);
          const repaired = await applyChunkBisecting(
            session,
            schema,
            plan,
            repair.lo,
            repair.hi,
            log,
            true,
          );
          stopped = repaired.stopped;
          if (!stopped) {
            if (repaired.last) {
              // The rest of the chunk is the next step's: it starts after the last key.
              await shrinkChunk(
                session,
                schema,
                plan.id,
                repair.chunk,
                repaired.last,
                repaired.keys,
              );
            } else {
              await deleteChunk(session, schema, plan.id, repair.chunk);
            }
            // Its rows count as done, the held ones included (they are found: status()
            // shows them as backfill.keysHeld).
            step = { upto: null, rows: repaired.keys };
          }
        } else {
          done = true;
        }
      } else if (stage === 'groups') {
        try {
          await session.query('SAVEPOINT trellis_groups');
          step = { upto: null, rows: await fillGroups(session, plan) };
          await session.query('RELEASE SAVEPOINT trellis_groups');
          done = true;
        } catch (error) {
          await session.query('ROLLBACK TO SAVEPOINT trellis_groups');
          if (!isRowError(error)) throw error;
          log.warn(
            { target: plan.target },
            'building the groups failed on a row: re-deriving them key by key',
          );
          next = 'repair';
        }
      } else {
        // Re-derivation upserts: it needs the key back.
        await restoreIndexes(session, schema, claim.transform_id);
        const repaired = await repairChunk(session, schema, plan, claim.backfill_position, log);
        stopped = repaired.stopped;
        step = repaired.step;
        done = !stopped && !step.upto;
      }
      if (stopped) {
        log.debug({ target: plan.target }, 'build stopped: the transform paused (quarantine)');
        return true;
      }
      if (done) {
        const indexed = await restoreIndexes(session, schema, claim.transform_id);
        await analyzeBuilt(session, plan, indexed);
      }
      await session.query(
        `UPDATE ${s}.pipeline
            SET backfill_position = $2, rebuild = false, backfill_stage = $4,
                backfill_total = coalesce($6::bigint, greatest(backfill_total, backfill_done + $3)),
                backfill_done = CASE WHEN $5 AND $7 IN ('rows', 'chunks')
                                     THEN coalesce($6::bigint, backfill_total)
                                     WHEN $6::bigint IS NOT NULL THEN 0
                                     ELSE backfill_done + $3 END,
                phase = CASE WHEN $5 THEN 'catching_up' ELSE phase END,
                build_attempts = 0, build_error = NULL, build_next_at = NULL, updated_at = now()
          WHERE transform_id = $1`,
        [
          claim.transform_id,
          step.upto,
          stage === 'repair' ? 0 : step.rows,
          next,
          done,
          total,
          stage,
        ],
      );
      // Its state change (catching up) is logged by the catalog watch.
      if (done) log.debug({ target: plan.target }, 'backfill done');
    } catch (error) {
      await session.query('ROLLBACK TO SAVEPOINT trellis_chunk');
      await recordBuildFailure(session, schema, claim, plan, error, log);
    }
    return true;
  });
}

/**
 * A rebuild of a target that has rows, in this transaction: the key map and group states
 * emptied (DELETE) and filled again, the target computed whole and merged (rederiveWhole).
 * Returns the rows the target holds, or null when the rebuild goes the usual way instead:
 * the target is empty (nothing for a reader to lose; the build may defer its indexes),
 * an earlier build's deferred indexes are not back yet (no key to merge on), or the
 * computation failed on a row (the usual build holds such rows' keys one by one).
 */
async function rebuildByMerge(
  session: Session,
  schema: string,
  plan: TransformPlan,
  log: Logger,
): Promise<number | null> {
  const [row] = await session.query<{ rows: boolean; deferred: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM ${plan.targetSql}) AS rows,
            (SELECT deferred_ddl IS NOT NULL FROM ${quoteIdent(schema)}.pipeline
              WHERE transform_id = $1) AS deferred`,
    [plan.id],
  );
  if (!row?.rows || row.deferred) return null;
  await session.query('SAVEPOINT trellis_rebuild_merge');
  try {
    await emptyKeyState(session, plan);
    const rows = await rederiveWhole(session, plan);
    await session.query('RELEASE SAVEPOINT trellis_rebuild_merge');
    return rows;
  } catch (error) {
    await session.query('ROLLBACK TO SAVEPOINT trellis_rebuild_merge');
    if (!isRowError(error)) throw error;
    log.warn(
      { target: plan.target, error: (error as Error).message },
      'a rebuild failed on a row in one transaction: the target is emptied (DELETE) and built by steps, holding the failing rows',
    );
    return null;
  }
}

/**
 * Fills a GROUP BY target, its key map and (kept by delta) its group states: one statement
 * (groupsFillSql), or three in order (deltaFillStatements). Returns the join rows mapped
 * (0 without a key map).
 */
async function fillGroups(session: Session, plan: TransformPlan): Promise<number> {
  let mapped: unknown;
  if (plan.delta) {
    const [first, ...rest] = deltaFillStatements(plan);
    mapped = await session.query(first!);
    for (const statement of rest) await session.query(statement);
    // A shadow's fill says what it mapped (shadowFillSql).
    if (plan.mapKind === 'shadow') {
      return Number((mapped as Array<{ rows?: number }>)[0]?.rows ?? 0);
    }
  } else if (plan.mapKind === 'shadow') {
    // A shadow's fill is a statement of CTEs that says what it mapped (shadowFillSql).
    const [row] = await session.query<{ rows: number }>(groupsFillSql(plan));
    return Number(row?.rows ?? 0);
  } else {
    mapped = await session.query(groupsFillSql(plan));
    if (!plan.mapSql) return 0;
  }
  // The key map's INSERT's row count (postgres.js sets it on the result).
  return (mapped as { count?: number }).count ?? 0;
}

/** The next chunk of REPAIR_ROWS driving keys after `position`: its end (null: the last chunk) and size. */
async function nextChunk(
  session: Session,
  plan: TransformPlan,
  position: string[] | null,
): Promise<Step> {
  const [end] = await session.query<{ upto: string[] }>(chunkEndSql(plan), [position, REPAIR_ROWS]);
  const upto = end?.upto ?? null;
  if (upto) return { upto, rows: REPAIR_ROWS };
  const [after] = await session.query<{ n: string }>(drivingRowsAfterSql(plan), [position]);
  return { upto: null, rows: Number(after?.n ?? 0) };
}

/**
 * Whether a claimed 'chunks' build still has chunks to fill, asked again under its row
 * lock. The claim's NOT EXISTS cannot be trusted for that: when the row it locks was
 * updated by a transaction that committed after the claim's snapshot (the step that
 * planned the chunks), Postgres re-checks the row's own columns on its new version but
 * evaluates the subquery in the old snapshot, which saw no chunk yet. The build would
 * then finish with every chunk unfilled (a CI run's target had one chunk of five).
 */
async function chunksLeftToFill(session: Session, schema: string, claim: Claim): Promise<boolean> {
  const [row] = await session.query<{ left: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM ${quoteIdent(schema)}.build_chunks
                     WHERE transform_id = $1 AND NOT repair) AS left`,
    [claim.transform_id],
  );
  return row?.left === true;
}

/**
 * At the start of a build into an empty target: drops the target's and key map's key
 * constraint and indexes, keeping what re-creates them. Inserting into a table without
 * indexes and building each index once at the end is far cheaper than maintaining them
 * row by row. Nothing else writes the target while it is backfilling.
 */
async function deferIndexes(
  session: Session,
  schema: string,
  transformId: number,
  plan: TransformPlan,
): Promise<void> {
  const tables = [
    plan.targetSql,
    ...(plan.mapSql ? [plan.mapSql] : []),
    ...(plan.delta ? [plan.delta.statesSql] : []),
  ];
  // A target another transform reads keeps its key: that transform's drain looks its rows
  // up by it while this build runs (a define over it later puts the key back first). The
  // check is made again under the lock the key's drop takes anyway: a define over this
  // target locks it before it looks for a deferred key (_restore_deferred_ddl, migration
  // 0021), so either it has committed and the second check sees its transform, or it
  // waits for this build and puts the key back.
  const eligible = async () => {
    const [row] = await session.query<{ ok: boolean }>(
      `SELECT NOT EXISTS (SELECT 1 FROM ${plan.targetSql})
              AND NOT EXISTS (SELECT 1 FROM ${quoteIdent(schema)}.transform_sources
                               WHERE source_oid = $1::regclass) AS ok`,
      [plan.targetSql],
    );
    return row?.ok === true;
  };
  if (!(await eligible())) return;
  await session.query(`LOCK TABLE ${plan.targetSql} IN ACCESS EXCLUSIVE MODE`);
  if (!(await eligible())) return;
  // Names qualified in full: the DDL may run in another session with another search_path.
  const indexes = await session.query<{ create: string; drop: string }>(
    `SELECT CASE WHEN con.oid IS NOT NULL
                 THEN format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', n.nspname, c.relname,
                             con.conname, pg_get_constraintdef(con.oid))
                 ELSE pg_get_indexdef(i.indexrelid) END AS create,
            CASE WHEN con.oid IS NOT NULL
                 THEN format('ALTER TABLE %s DROP CONSTRAINT %I', i.indrelid::regclass, con.conname)
                 ELSE format('DROP INDEX %s', i.indexrelid::regclass) END AS drop
       FROM pg_index i
       JOIN pg_class c ON c.oid = i.indrelid
       JOIN pg_namespace n ON n.oid = c.relnamespace
      LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.contype IN ('p', 'u')
      WHERE i.indrelid = ANY ($1::regclass[])`,
    [tables],
  );
  if (indexes.length === 0) return;
  for (const index of indexes) await session.query(index.drop);
  await session.query(
    `UPDATE ${quoteIdent(schema)}.pipeline SET deferred_ddl = $2 WHERE transform_id = $1`,
    [transformId, indexes.map((i) => i.create)],
  );
}

/** Re-creates what deferIndexes dropped (nothing when nothing was). Returns whether it did. */
async function restoreIndexes(
  session: Session,
  schema: string,
  transformId: number,
): Promise<boolean> {
  const s = quoteIdent(schema);
  const [row] = await session.query<{ ddl: string[] | null }>(
    `SELECT deferred_ddl AS ddl FROM ${s}.pipeline WHERE transform_id = $1`,
    [transformId],
  );
  if (!row?.ddl) return false;
  for (const ddl of row.ddl) await session.query(ddl);
  await session.query(`UPDATE ${s}.pipeline SET deferred_ddl = NULL WHERE transform_id = $1`, [
    transformId,
  ]);
  return true;
}

/** Stage 'repair': re-derives one chunk of driving keys through the bisecting path. */
async function repairChunk(
  session: Session,
  schema: string,
  plan: TransformPlan,
  position: string[] | null,
  log: Logger,
): Promise<{ step: Step; stopped: boolean }> {
  const step = await nextChunk(session, plan, position);
  const { stopped } = await applyChunkBisecting(session, schema, plan, position, step.upto, log);
  return { step, stopped };
}

/**
 * A chunk with a row that fails: every driving key of the chunk is re-derived through
 * the drain's bisecting path, so the failing rows are held and the rest filled. Returns
 * how many driving keys the chunk has, and whether the transform paused partway (at
 * quarantineThreshold: the bisection stops there).
 */
async function applyChunkBisecting(
  session: Session,
  schema: string,
  plan: TransformPlan,
  position: string[] | null,
  upto: string[] | null,
  log: Logger,
  /**
   * Stop after the slice in which the step held REPAIR_STEP_HELD keys or ran REPAIR_STEP_MS;
   * `last` is then the last key it went through (the rest is the next step's).
   */
  stepwise = false,
): Promise<{ keys: number; stopped: boolean; last: string[] | null }> {
  const driving = plan.sources[0]!;
  const keys = driving.keyColumns.map((k) => `d.${quoteIdent(k)}`);
  const tuple = (items: string[]) => (items.length === 1 ? items[0]! : `(${items.join(', ')})`);
  const rows = await session.query<{ k: string[] }>(
    `SELECT ARRAY[${keys.map((k) => `${k}::text`).join(', ')}] AS k FROM ${driving.table} d
      WHERE ($1::text[] IS NULL OR ${tuple(keys)} > ${typedParam(driving, '$1')})
        AND ($2::text[] IS NULL OR ${tuple(keys)} <= ${typedParam(driving, '$2')})
      ORDER BY ${keys.join(', ')}`,
    [position, upto],
  );
  const run = newBisection(plan);
  const started = performance.now();
  const all = rows.map((r) => ({ s: driving.sourceId!, k: r.k }));
  const slice = stepwise ? REPAIR_SLICE_KEYS : Math.max(1, all.length);
  let done = all.length;
  let last: string[] | null = null;
  run.depth += 1; // one summary line for the whole step, said below
  try {
    for (let at = 0; at < all.length; at += slice) {
      const part = all.slice(at, at + slice);
      await applyKeysBisecting(session, schema, plan, part, log, undefined, run);
      if (run.stopped) break;
      const more = at + slice < all.length;
      if (more && (run.held >= REPAIR_STEP_HELD || performance.now() - started >= REPAIR_STEP_MS)) {
        done = at + part.length;
        last = part[part.length - 1]!.k;
        break;
      }
    }
  } finally {
    run.depth -= 1;
  }
  summarize(run, log);
  return { keys: done, stopped: run.stopped, last };
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
    { target: plan.target, attempts, sqlstate: sqlstateOf(error), paused: pause, error: message },
    `backfill chunk failed: ${message}`,
  );
}
