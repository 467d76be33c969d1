import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';
import { analyzeRefilled } from './analyze-built.js';
import { type ApplyMode, recordCost } from './apply-choice.js';
import { applyKeysBisecting, type ChangedKey, newBisection } from './apply-keys.js';
import { changedFromLedger } from './changed-sql.js';
import { advanceCursor } from './cursor.js';
import { deltaRefillStatements } from './delta-sql.js';
import type { TransformPlan } from './plan.js';
import type { PlanCache } from './plan-cache.js';
import { emptyKeyState } from './rebuild-merge.js';
import { rederiveSql } from './rederive-sql.js';
import { backoffMs, isRowError } from './row-errors.js';
import type { ChangedSources } from './shadow-sql.js';
import { type AppliedWork, appliedWork, emptyTally, rederiveCounted, type Tally } from './tally.js';
import { enterTransformWork, keepsWrittenJoinOrder, withApplySettings } from './work-settings.js';

interface Claim {
  transform_id: number;
  page: number;
  gen: number | null;
  blk_lo: string | null;
  blk_hi: string | null;
  bucket: number;
  buckets: number;
  attempts: number;
  lo_snap: string;
  hi_snap: string;
  backend: number;
  claimed_ms: number;
}

/**
 * Claims one open page (FOR UPDATE SKIP LOCKED: a claim dies with its session, so a page
 * whose drain died is taken over) and applies it in one transaction: re-derive its keys,
 * delete the page, and move the cursor when it was the range's last. A row that fails is
 * found by bisection and held; a page that fails for no row's fault is retried later
 * with backoff and reported. Returns false when no page was open.
 *
 * The claim locks the page's bucket slot too: pages of one bucket can hold the same keys,
 * and applied at once they would lock the same target rows in different orders. Pages of
 * different buckets hold different keys and apply in parallel.
 */
export async function applyPage(
  session: Session,
  schema: string,
  plans: PlanCache,
  log: Logger,
): Promise<AppliedWork | null> {
  const s = quoteIdent(schema);
  const started = performance.now();
  return session.transaction(async () => {
    const [claim] = await session.query<Claim>(
      `SELECT p.transform_id, p.page, p.gen, p.blk_lo, p.blk_hi, p.bucket, p.buckets, p.attempts,
              lo.snap::text AS lo_snap, hi.snap::text AS hi_snap, pg_backend_pid() AS backend,
              (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS claimed_ms
         FROM ${s}.pages p
         JOIN ${s}.page_slots slot ON slot.transform_id = p.transform_id AND slot.bucket = p.bucket
         JOIN ${s}.pipeline pl ON pl.transform_id = p.transform_id
         JOIN ${s}.transforms t ON t.id = p.transform_id
         JOIN ${s}.ticks lo ON lo.seq = pl.open_lo
         JOIN ${s}.ticks hi ON hi.seq = pl.open_hi
         -- Least served first (ADR 0045): a transform no loop is working for, with the
         -- least drain time lately; never the last free loop for one another loop serves.
         LEFT JOIN ${s}._drain_ranks() r ON r.transform_id = p.transform_id
        WHERE t.paused_at IS NULL AND (p.not_before IS NULL OR p.not_before <= now())
          AND NOT coalesce(r.reserved, false)
        ORDER BY r.serving, r.recent, pl.open_lo, p.transform_id, p.page
        LIMIT 1
          FOR UPDATE OF p, slot SKIP LOCKED`,
    );
    if (!claim) return null;
    const plan = await plans.load(session, claim.transform_id);
    await enterTransformWork(session, schema, plan, true);
    // Another loop claimed a page of this transform at the same moment, and this one is
    // the last left for every other transform's work: it leaves the page (ADR 0045).
    const [yielded] = await session.query<{ y: boolean }>(`SELECT ${s}._drain_yield($1) AS y`, [
      claim.transform_id,
    ]);
    if (yielded?.y) return null;
    const changed = changedFromLedger(schema, plan, claim.gen, claim.buckets);
    const params: unknown[] = [claim.lo_snap, claim.hi_snap];
    if (claim.gen !== null) params.push(`(${claim.blk_lo},0)`, `(${claim.blk_hi},0)`);
    if (claim.buckets > 1) params.push(claim.bucket);

    const { failure, tally, paused } = await applyChanged(
      session,
      schema,
      plan,
      changed,
      params,
      log,
    );
    if (failure !== null) {
      await recordPageFailure(session, schema, claim, failure, log, plan.target);
      return appliedWork(plan.target, tally, started, true);
    }
    // The transform paused at quarantineThreshold partway: the page stays, with the keys
    // held so far, and is applied again (idempotently) after RESUME.
    if (paused) return appliedWork(plan.target, tally, started, false);

    const [done] = await session.query<{ applied_ms: number }>(
      `DELETE FROM ${s}.pages WHERE transform_id = $1 AND page = $2
       RETURNING (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS applied_ms`,
      [claim.transform_id, claim.page],
    );
    // When the page's keys were re-derived, by the server's clock (the same for every
    // process): pages of one range whose times overlap ran side by side
    // (test/apply-choice.test.ts). The cursor's move after it is one at a time.
    log.debug(
      {
        target: plan.target,
        page: claim.page,
        bucket: claim.bucket,
        keys: tally.keys,
        backend: claim.backend,
        fromMs: claim.claimed_ms,
        toMs: done?.applied_ms,
      },
      'a page applied',
    );
    const [left] = await session.query<{ pages_left: number; open_hi: string }>(
      `UPDATE ${s}.pipeline SET pages_left = pages_left - 1, updated_at = now()
        WHERE transform_id = $1 RETURNING pages_left, open_hi`,
      [claim.transform_id],
    );
    if (left && left.pages_left <= 0) {
      await advanceCursor(session, schema, claim.transform_id, left.open_hi);
    }
    const applied = appliedWork(plan.target, tally, started, false);
    await recordCost(
      session,
      schema,
      plan,
      plan.delta ? 'delta' : 'rederive',
      tally.keys,
      applied.seconds * 1000,
    );
    return applied;
  });
}

/**
 * Re-derives the keys `changed` yields (the body of a `changed` CTE reading a ledger range,
 * with its `params`: `$1` is the snapshot of the tick the range starts after) inside the
 * current transaction. A failure some rows explain is bisected to those rows, which are
 * held; the rest is applied. Returns a null failure when applied, or the error no row
 * explains (everything this call did is then rolled back), with what was applied.
 */
export async function applyChanged(
  session: Session,
  schema: string,
  plan: TransformPlan,
  changed: string,
  params: unknown[],
  log: Logger,
  /** How the changes are applied (see apply-choice.ts); a row error bisects key by key either way. */
  mode: ApplyMode = 'rederive',
): Promise<{ failure: unknown | null; tally: Tally; paused: boolean }> {
  await session.query('SAVEPOINT trellis_page');
  const tally = emptyTally();
  try {
    if (mode === 'recompute' && plan.delta) {
      // Refilled whole (the key map, then the states, as a build does), then the target
      // merged (deltaRecomputeSql); rolled back with it on failure.
      // DELETE, not TRUNCATE: MVCC-safe for a self-check's repeatable-read comparison, and
      // no ACCESS EXCLUSIVE lock to wait for one (ADR 0076).
      await emptyKeyState(session, plan);
      for (const fill of deltaRefillStatements(plan)) await session.query(fill);
    }
    const sources = await changedSources(session, plan, changed, params, mode);
    await withApplySettings(session, keepsWrittenJoinOrder(plan, mode), () =>
      rederiveCounted(session, rederiveSql(plan, changed, '$1', mode, sources), params, tally),
    );
    if (mode === 'recompute' && plan.delta) await analyzeRefilled(session, plan);
    await session.query('RELEASE SAVEPOINT trellis_page');
    return { failure: null, tally, paused: false };
  } catch (error) {
    await session.query('ROLLBACK TO SAVEPOINT trellis_page');
    Object.assign(tally, emptyTally());
    if (!isRowError(error)) return { failure: error, tally, paused: false };
    try {
      const keys = await session.query<{ s: number; k: string[] }>(
        `SELECT DISTINCT source_id AS s, key AS k FROM (${changed}) c ORDER BY 1, 2`,
        params,
      );
      const run = newBisection(plan);
      await applyKeysBisecting(session, schema, plan, keys as ChangedKey[], log, tally, run);
      await session.query('RELEASE SAVEPOINT trellis_page');
      return { failure: null, tally, paused: run.stopped };
    } catch (bisectError) {
      await session.query('ROLLBACK TO SAVEPOINT trellis_page');
      return { failure: bisectError, tally: emptyTally(), paused: false };
    }
  }
}

/**
 * For a transform whose key map is a shadow, re-deriving by group or applying by delta:
 * the sources the changes are of (one read of the range's ledger rows), so that its
 * statement joins and plans only for those (ADR 0061, ADR 0067). Null otherwise (every
 * source).
 */
async function changedSources(
  session: Session,
  plan: TransformPlan,
  changed: string,
  params: unknown[],
  mode: ApplyMode,
): Promise<ChangedSources> {
  if (plan.mapKind !== 'shadow' || mode === 'recompute') return null;
  const [row] = await session.query<{ ids: number[] | null }>(
    `SELECT array_agg(DISTINCT c.source_id) AS ids FROM (${changed}) c`,
    params,
  );
  return new Set(row?.ids ?? []);
}

async function recordPageFailure(
  session: Session,
  schema: string,
  claim: Claim,
  error: unknown,
  log: Logger,
  target: string,
): Promise<void> {
  const message = error instanceof Error ? error.message : String(error);
  const attempts = claim.attempts + 1;
  await session.query(
    `UPDATE ${quoteIdent(schema)}.pages
        SET attempts = $3, error = $4, sqlstate = $5,
            first_failed_at = coalesce(first_failed_at, now()), last_failed_at = now(),
            not_before = now() + make_interval(secs => $6::float8 / 1000)
      WHERE transform_id = $1 AND page = $2`,
    [
      claim.transform_id,
      claim.page,
      attempts,
      message,
      sqlstateOf(error) ?? null,
      backoffMs(attempts),
    ],
  );
  log.warn(
    { target, page: claim.page, attempts, sqlstate: sqlstateOf(error), error: message },
    `drain page failed: ${message}`,
  );
}
