import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';

/**
 * How long the switch waits for the target's lock before it gives up for this pass and
 * tries again on the next (ADR 0055). A switch queued behind a long reader would hold every
 * later reader behind it; this bounds what a reader can wait for a switch to start.
 */
export const SWITCH_LOCK_TIMEOUT_MS = 500;

/** What `<schema>._redefine_switch` reports. */
export interface SwitchReport {
  switched: boolean;
  why?: string;
  target?: string;
  changes?: string[];
  deleted?: number;
  written?: number;
  /** From the moment the target's lock was granted to the end of the switch's statements. */
  lockMs?: number;
  /** How long of that the lock was ACCESS EXCLUSIVE (readers waited): 0 when it never was. */
  readersBlockedMs?: number;
  /** Whether the new columns were staged and filled before the switch (ADR 0055 addendum). */
  staged?: boolean;
}

/** Rows per batch of a staged redefinition's fill (each batch a transaction of its own). */
export const FILL_BATCH_ROWS = 5000;

/** Whether an error is a lock that could not be had (or a deadlock): tried again later. */
function lockedOut(error: unknown): boolean {
  const state = sqlstateOf(error);
  return (
    state === SQLSTATE.lockNotAvailable ||
    state === SQLSTATE.deadlockDetected ||
    state === SQLSTATE.serializationFailure
  );
}

/**
 * Before the switch (ADR 0055's addendum): the columns the new definition adds, retypes or
 * replaces are added to the target as staged columns, in a short transaction of their own
 * (no rewrite), then filled from the shadow by batches of rows, each a transaction holding
 * the drain's locks of the transform and its shadow, so the switch's ACCESS EXCLUSIVE lock
 * covers metadata only. `prepare` false (a long reader holds the target): the fill only, of
 * columns added on an earlier pass. Returns false when a lock could not be had (tried again
 * on the next pass).
 */
async function stage(
  session: Session,
  s: string,
  shadowId: number,
  log: Logger,
  prepare: boolean,
): Promise<boolean> {
  if (prepare) {
    try {
      const added = await session.transaction(async () => {
        await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
        const [row] = await session.query<{ added: number }>(
          `SELECT ${s}._redefine_prepare($1) AS added`,
          [shadowId],
        );
        return Number(row?.added ?? 0);
      });
      // Columns just added: filled and switched to from the next pass on (the worker comes
      // back soon), so the switch never follows in the instant the target changed shape.
      if (added > 0) return false;
    } catch (error) {
      if (lockedOut(error)) return false;
      throw error;
    }
  }
  let after: string[] | null = null;
  let updated = 0;
  for (;;) {
    let batch: { updated: number; last: string[] | null };
    try {
      batch = await session.transaction(async () => {
        await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
        const [row] = await session.query<{ r: { updated: number; last: string[] | null } }>(
          `SELECT ${s}._redefine_fill($1, $2::text[], $3) AS r`,
          [shadowId, after, FILL_BATCH_ROWS],
        );
        return row!.r;
      });
    } catch (error) {
      if (lockedOut(error)) return false;
      throw error;
    }
    updated += Number(batch.updated);
    if (batch.last === null) break;
    after = batch.last;
  }
  if (updated > 0)
    log.debug({ shadow: shadowId, updated }, "a redefinition's staged columns were filled");
  return true;
}

interface Shadow {
  id: number;
  target: string;
  phase: string;
  paused: boolean;
  reason: string | null;
}

/**
 * The staging worker's step for redefinitions (`ALTER TRANSFORM t AS …`, ADR 0055): each
 * shadow that is live is switched to, in one transaction of its own
 * (`<schema>._redefine_switch`); one that paused (its build failed, a source broke it) is
 * given up, and so is one whose switch is refused, the transform saying why
 * (`redefinition.state = 'failed'`). A switch that meets a lock held too long (a long read
 * of the target) is tried again on the next pass. Returns whether some redefinition is
 * still to switch (the worker comes back soon).
 */
export async function switchRedefinitions(
  session: Session,
  schema: string,
  log: Logger,
): Promise<boolean> {
  const s = quoteIdent(schema);
  const shadows = await session.query<Shadow>(
    `SELECT x.id, t.target_name AS target, p.phase, x.paused_at IS NOT NULL AS paused,
            coalesce(x.capture_failure->>'error', p.build_error, x.pause_reason) AS reason
       FROM ${s}.transforms x
       JOIN ${s}.transforms t ON t.id = x.redefines
       JOIN ${s}.pipeline p ON p.transform_id = x.id
      WHERE x.redefines IS NOT NULL
      ORDER BY x.id`,
  );
  let pending = !(await dropOrphanParts(session, s, log));
  for (const shadow of shadows) {
    if (shadow.paused) {
      const reason = `its new definition stopped while it was built: ${shadow.reason ?? 'paused'}`;
      if (!(await abandon(session, s, shadow.id, reason))) {
        pending = true;
        continue;
      }
      log.warn({ target: shadow.target, reason }, 'a redefinition was given up');
      continue;
    }
    if (shadow.phase !== 'live') {
      pending = true;
      continue;
    }
    // A transaction holding a lock on the target for longer than the switch would wait for
    // it (a long report): no attempt this pass. An attempt holds the drain's row locks of
    // the transform, its shadow and its chains while it waits for the table, and attempts
    // one after another would starve their drains for as long as that reader runs.
    const [busy] = await session.query<{ busy: boolean }>(
      `SELECT EXISTS (
         SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
            AND l.relation = (SELECT t.target_oid FROM ${s}.transforms t
                               JOIN ${s}.transforms x ON x.redefines = t.id WHERE x.id = $1)
            AND a.xact_start < clock_timestamp() - make_interval(secs => $2::float8 / 1000)) AS busy`,
      [shadow.id, SWITCH_LOCK_TIMEOUT_MS],
    );
    // The fill goes on under a long reader (it takes no lock a reader waits for); adding
    // the staged columns and the switch wait for it to end.
    try {
      if (!(await stage(session, s, shadow.id, log, !busy?.busy))) {
        pending = true;
        continue;
      }
    } catch (error) {
      const state = sqlstateOf(error);
      if (state === undefined || state.startsWith('08')) throw error;
      const reason = (error as Error).message;
      if (await abandon(session, s, shadow.id, reason)) {
        log.warn({ target: shadow.target, reason }, 'a redefinition was given up');
      } else {
        pending = true;
      }
      continue;
    }
    if (busy?.busy) {
      pending = true;
      continue;
    }
    const started = performance.now();
    let report: SwitchReport;
    try {
      report = await session.transaction(async () => {
        await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
        const [row] = await session.query<{ report: SwitchReport }>(
          `SELECT ${s}._redefine_switch($1) AS report`,
          [shadow.id],
        );
        return row!.report;
      });
    } catch (error) {
      const state = sqlstateOf(error);
      if (lockedOut(error)) {
        pending = true;
        log.info(
          { target: shadow.target, error: (error as Error).message },
          'a redefinition waits for a lock on its target: tried again on the next pass',
        );
        continue;
      }
      if (state === undefined || state.startsWith('08')) throw error;
      const reason = (error as Error).message;
      if (!(await abandon(session, s, shadow.id, reason))) {
        pending = true;
        continue;
      }
      log.warn({ target: shadow.target, reason }, 'a redefinition was given up');
      continue;
    }
    if (!report.switched) {
      pending = true;
      continue;
    }
    log.info(
      {
        target: shadow.target,
        changes: report.changes,
        deleted: report.deleted,
        written: report.written,
        lockMs: report.lockMs,
        readersBlockedMs: report.readersBlockedMs,
        staged: report.staged,
        switchMs: Math.round((performance.now() - started) * 100) / 100,
      },
      'a transform was switched to its new definition',
    );
    // The old definition's parts (a statement with subqueries, ADR 0056), whose transform
    // is now the shadow's: dropped in a transaction of their own (no lock on the target).
    if (!(await dropOrphanParts(session, s, log))) pending = true;
  }
  return pending;
}

/**
 * Drops the hidden parts of a definition switched away from (`<schema>._drop_orphan_parts`,
 * ADR 0055's second addendum), under a short lock_timeout; false when a lock could not be
 * had (tried again on the next pass).
 */
async function dropOrphanParts(session: Session, s: string, log: Logger): Promise<boolean> {
  // A read first (no transaction, no lock): there are none on nearly every pass.
  const [left] = await session.query<{ any: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM ${s}.transforms x
                     WHERE x.part_of IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM ${s}.transforms o WHERE o.id = x.part_of)) AS any`,
  );
  if (!left?.any) return true;
  try {
    const dropped = await session.transaction(async () => {
      await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
      const [row] = await session.query<{ n: number }>(`SELECT ${s}._drop_orphan_parts() AS n`);
      return Number(row?.n ?? 0);
    });
    if (dropped > 0) log.debug({ dropped }, "an old definition's parts were dropped");
    return true;
  } catch (error) {
    if (lockedOut(error)) return false;
    throw error;
  }
}

/**
 * Gives a redefinition up (`<schema>._redefine_abandon`): the shadow goes, and with it any
 * staged columns on the target, which takes the target's lock briefly. Under a short
 * lock_timeout, so a long reader is not queued behind; false when it could not be had
 * (tried again on the next pass).
 */
async function abandon(
  session: Session,
  s: string,
  shadowId: number,
  reason: string,
): Promise<boolean> {
  try {
    await session.transaction(async () => {
      await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
      await session.query(`SELECT ${s}._redefine_abandon($1, $2)`, [shadowId, reason]);
    });
    return true;
  } catch (error) {
    if (lockedOut(error)) return false;
    throw error;
  }
}
