import type { Session } from '../db/session.js';
import { BUILD_ATTEMPTS_BEFORE_PAUSE } from '../drain/backfill.js';
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

/** Keys per page of a redefinition's logged diff (each page a transaction of its own). */
export const LOG_PAGE_ROWS = 5000;

/** How long one pass of the staging worker pages a redefinition's diff log before it moves on. */
export const LOG_PASS_MS = 1000;

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
  /** Its build failing and being tried again (not paused yet): the error and the attempts. */
  retrying: string | null;
}

/** A transaction holding a lock on the target that conflicts with the switch's (`_redefine_blockers`). */
interface Blocker {
  pid: number;
  mode: string;
  /** When its transaction began (text, the server's). */
  since: string;
}

/** A hidden part of a redefinition's new definition (ADR 0056's parts, defined by `ALTER … AS`). */
interface NewPart {
  id: number;
  target: string;
  name: string;
  phase: string;
  /** Why it stopped (the transform paused, or one of its columns): null while it is not. */
  stopped: string | null;
  /**
   * Why it failed without pausing (ADR 0055's fourth addendum): keys held (rows it could not
   * compute, below the quarantine threshold), the last error with them. Null when none is.
   */
  failed: string | null;
  /** Its build failing and being tried again (not paused yet): the error and the attempts. */
  retrying: string | null;
}

/**
 * Where each redefinition with parts stands in making sure its shadow has every row its
 * parts' builds wrote (keyed `<schema>:<shadow id>`): a snapshot taken once every part was
 * live, and the round (a part reading another part needs one round per level). Kept in
 * memory: a worker that starts again starts the rounds again, which only delays a switch.
 */
const partRounds = new Map<string, { token: string; lsn: string; round: number }>();

/**
 * The parts of shadow `shadowId` (every transform whose `part_of` it is), and why each
 * stopped, if it did: paused whole (quarantine, a capture failure, an operator), or a
 * column of it paused (its values frozen: the new definition's contents would be wrong).
 */
async function newParts(session: Session, s: string, shadowId: number): Promise<NewPart[]> {
  return session.query<NewPart>(
    `SELECT x.id, x.target_name AS target, coalesce(x.part_name, x.target_name) AS name, p.phase,
            CASE WHEN x.paused_at IS NOT NULL THEN
                   coalesce(x.capture_failure->>'error', x.pause_reason, 'paused')
                   -- A build that failed until it paused: its error.
                   || coalesce(': ' || CASE WHEN x.pause_reason = 'build_failure' THEN p.build_error END, '')
                   || coalesce(' (' || h.n || ' keys held, the last: ' || h.error || ')', '')
                 ELSE (SELECT format('its column %s paused: %s', c.name, coalesce(c.pause_reason, 'paused'))
                         FROM ${s}.transform_columns c
                        WHERE c.transform_id = x.id AND c.paused_at IS NOT NULL ORDER BY c.name LIMIT 1) END
              AS stopped,
            CASE WHEN h.n > 0 THEN
                   format('%s %s it could not compute (%s), the last: %s', h.n,
                          CASE WHEN h.n = 1 THEN 'row' ELSE 'rows' END,
                          CASE WHEN h.n = 1 THEN 'its key held' ELSE 'their keys held' END, h.error) END
              AS failed,
            CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL THEN
                   format('its build failed (%s of %s attempts before it pauses): %s',
                          p.build_attempts, $2::int, p.build_error) END
              AS retrying
       FROM ${s}.transforms x JOIN ${s}.pipeline p ON p.transform_id = x.id
       LEFT JOIN LATERAL (
         SELECT count(*) OVER () AS n, k.error FROM ${s}.held_keys k
          WHERE k.transform_id = x.id ORDER BY k.held_at DESC LIMIT 1) h ON true
      WHERE x.part_of = $1
      ORDER BY x.id`,
    [shadowId, BUILD_ATTEMPTS_BEFORE_PAUSE],
  );
}

/**
 * Records `error` in the redefinition being built of shadow `shadowId` (status().redefinition
 * .error): what it waits on, or why it is being given up while that waits for its lock.
 */
async function noteBuilding(
  session: Session,
  s: string,
  shadowId: number,
  error: string | null,
): Promise<void> {
  await session.query(
    `UPDATE ${s}.transforms t
        SET redefinition = CASE WHEN $2::text IS NULL THEN t.redefinition - 'error'
                                ELSE t.redefinition || jsonb_build_object('error', $2::text) END
      WHERE t.id = (SELECT x.redefines FROM ${s}.transforms x WHERE x.id = $1)
        AND t.redefinition->>'state' = 'building'
        AND t.redefinition->>'error' IS DISTINCT FROM $2::text`,
    [shadowId, error],
  );
}

/**
 * Whether the shadow of a redefinition with parts has what its parts' builds wrote. A
 * shadow reading a part is built from the part's target as it is, and goes live as soon as
 * its own build ends, while the part may still be building (its rows reach the shadow
 * later, through the ledger, as a chain's do): switching then would show readers a
 * half-built target (an empty one, when the shadow was built before any part's row). So:
 * every part live, then every part and the shadow converged up to a snapshot taken after
 * that, once per part (a part reading another needs a round per level).
 */
async function partsCaughtUp(
  session: Session,
  s: string,
  key: string,
  shadowId: number,
  parts: NewPart[],
): Promise<boolean> {
  if (parts.some((p) => p.phase !== 'live')) {
    partRounds.delete(key);
    return false;
  }
  const now = async (round: number) => {
    const [row] = await session.query<{ token: string; lsn: string }>(
      'SELECT pg_current_snapshot()::text AS token, pg_current_wal_insert_lsn()::text AS lsn',
    );
    const at = { token: row!.token, lsn: row!.lsn, round };
    partRounds.set(key, at);
    return at;
  };
  const at = partRounds.get(key) ?? (await now(1));
  // Under WAL capture, the ledger holds what was decoded: the snapshot's writes first.
  const [row] = await session.query<{ ok: boolean }>(
    `SELECT ${s}._wal_decoded($3::pg_lsn)
            AND (SELECT bool_and(${s}._converged(m, $2::pg_snapshot)) FROM unnest($1::int[]) m) AS ok`,
    [[shadowId, ...parts.map((p) => p.id)], at.token, at.lsn],
  );
  if (!row?.ok) return false;
  if (at.round >= parts.length) return true;
  await now(at.round + 1);
  return false;
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
            coalesce(x.capture_failure->>'error', p.build_error, x.pause_reason) AS reason,
            CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL AND x.paused_at IS NULL THEN
                   format('build failed (%s of %s attempts before it pauses): %s',
                          p.build_attempts, $1::int, p.build_error) END AS retrying
       FROM ${s}.transforms x
       JOIN ${s}.transforms t ON t.id = x.redefines
       JOIN ${s}.pipeline p ON p.transform_id = x.id
      WHERE x.redefines IS NOT NULL
      ORDER BY x.id`,
    [BUILD_ATTEMPTS_BEFORE_PAUSE],
  );
  let pending = !(await dropOrphanParts(session, s, log));
  if (!(await dropLogTriggers(session, s, log))) pending = true;
  for (const key of partRounds.keys()) {
    if (key.startsWith(`${schema}:`) && !shadows.some((x) => `${schema}:${x.id}` === key)) {
      partRounds.delete(key);
    }
  }
  for (const shadow of shadows) {
    const parts = await newParts(session, s, shadow.id);
    const stoppedPart = parts.find((p) => p.stopped !== null);
    const failedPart = parts.find((p) => p.failed !== null);
    if (shadow.paused || stoppedPart || failedPart) {
      // A new part stopped (a quarantine, a capture failure, a build failing until it
      // paused) is the new definition stopped: its shadow would never have the part's rows.
      // So is one holding keys (rows it could not compute, below the quarantine threshold):
      // switching would show readers a target without those rows. Given up, saying which
      // part and why; the old definition keeps serving.
      const reason = shadow.paused
        ? `its new definition stopped while it was built: ${shadow.reason ?? 'paused'}`
        : stoppedPart
          ? `its new definition's part ${stoppedPart.name} stopped while it was built: ${stoppedPart.stopped}`
          : `its new definition's part ${failedPart!.name} failed while it was built: ${failedPart!.failed}`;
      if (!(await abandon(session, s, shadow.id, reason))) {
        // Visible meanwhile (status().redefinition.error), while it waits for its lock.
        await noteBuilding(session, s, shadow.id, `being given up: ${reason}`);
        pending = true;
        continue;
      }
      log.warn({ target: shadow.target, reason }, 'a redefinition was given up');
      continue;
    }
    // A build failing and tried again (it pauses after a few attempts, and the redefinition
    // is then given up): said meanwhile, the shadow's own or a part's.
    const retryingPart = parts.find((p) => p.retrying !== null);
    const retrying = shadow.retrying
      ? `waiting: its new definition's ${shadow.retrying}`
      : retryingPart
        ? `waiting: its new definition's part ${retryingPart.name}: ${retryingPart.retrying}`
        : null;
    if (
      shadow.phase !== 'live' ||
      (parts.length > 0 &&
        !(await partsCaughtUp(session, s, `${schema}:${shadow.id}`, shadow.id, parts)))
    ) {
      await noteBuilding(session, s, shadow.id, retrying);
      pending = true;
      continue;
    }
    // A transaction holding a lock on the target for longer than the switch would wait for
    // it (a long report), in a mode that conflicts with the lock the next step takes: no
    // attempt this pass. An attempt holds the drain's row locks of the transform, its
    // shadow and its chains while it waits for the table, and attempts one after another
    // would starve their drains for as long as that reader runs. A plain reader's ACCESS
    // SHARE conflicts only with ACCESS EXCLUSIVE (columns staged or changed, the key or NOT
    // NULL changed): a filter change's switch (EXCLUSIVE) goes on beside it.
    const [pre] = await session.query<{ mode: string; blockers: Blocker[] }>(
      `SELECT m.mode, ${s}._redefine_blockers(t.target_oid, m.mode, $2::float8) AS blockers
         FROM ${s}.transforms x JOIN ${s}.transforms t ON t.id = x.redefines
        CROSS JOIN LATERAL (SELECT ${s}._redefine_lock_mode(x.id) AS mode) m
        WHERE x.id = $1`,
      [shadow.id, SWITCH_LOCK_TIMEOUT_MS],
    );
    const blocker = pre?.blockers[0];
    const busy = { busy: blocker !== undefined };
    await noteBuilding(
      session,
      s,
      shadow.id,
      blocker
        ? `waiting: the switch takes ${pre!.mode} on the target, and the transaction of pid ${blocker.pid} (begun ${blocker.since}) holds ${blocker.mode} on it: tried again once it ends`
        : retrying,
    );
    // The fill goes on under a long reader (it takes no lock a reader waits for); adding
    // the staged columns and the switch wait for it to end.
    try {
      if (!(await stage(session, s, shadow.id, log, !busy.busy))) {
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
    // A switch changing no column or key (a filter, a projection's expressions): the keys
    // where the target and the new definition differ, logged before it, so the switch
    // diffs those only (ADR 0055's fourth addendum). Under a long reader too (the log's
    // triggers wait for writers only, its pages for nobody): the log then keeps up while
    // the switch waits.
    if (!(await logDiff(session, s, shadow.id, log))) {
      pending = true;
      continue;
    }
    if (busy.busy) {
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

/**
 * Before a switch that changes no column, key or NOT NULL (ADR 0055's fourth addendum): a
 * log of keys (`<schema>._redefine_log_start`: a table, and triggers on the target and the
 * shadow adding the keys of every row written), then pages of the shadow's keys
 * (`_redefine_log_page`), each a transaction of its own, adding the keys where the two
 * tables differ; the switch then diffs the logged keys only. Pages for at most LOG_PASS_MS
 * a pass. Returns false when the pages are not all done or a lock could not be had (tried
 * again on the next pass); true when the log is done, or when the switch cannot use one (it
 * diffs whole, as before).
 */
async function logDiff(
  session: Session,
  s: string,
  shadowId: number,
  log: Logger,
): Promise<boolean> {
  try {
    const started = await session.transaction(async () => {
      await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
      const [row] = await session.query<{ ok: boolean }>(
        `SELECT ${s}._redefine_log_start($1) AS ok`,
        [shadowId],
      );
      return row?.ok === true;
    });
    if (!started) return true;
    let pages = 0;
    const began = performance.now();
    for (;;) {
      const done = await session.transaction(async () => {
        await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
        const [row] = await session.query<{ done: boolean }>(
          `SELECT ${s}._redefine_log_page($1, $2) AS done`,
          [shadowId, LOG_PAGE_ROWS],
        );
        return row?.done !== false;
      });
      pages += 1;
      if (done) break;
      // The rest on later passes: the staging worker has ticks and captures to see to.
      if (performance.now() - began >= LOG_PASS_MS) return false;
    }
    if (pages > 1) {
      log.debug(
        { shadow: shadowId, pages, ms: Math.round(performance.now() - began) },
        "a redefinition's diff was logged",
      );
    }
    return true;
  } catch (error) {
    if (lockedOut(error)) return false;
    const state = sqlstateOf(error);
    if (state === undefined || state.startsWith('08')) throw error;
    // The switch can always diff whole: the log goes, and it does.
    log.warn(
      { shadow: shadowId, error: (error as Error).message },
      "a redefinition's diff could not be logged: its switch diffs the whole target",
    );
    await session.query(`DELETE FROM ${s}.redefine_logs WHERE shadow_id = $1`, [shadowId]);
    return true;
  }
}

/**
 * Drops the log triggers a redefinition left on its target (`<schema>._redefine_log_cleanup`):
 * DROP TRIGGER takes ACCESS EXCLUSIVE for a catalog change, so not where a transaction has
 * held a lock on the table for longer than the switch's lock timeout, and under that
 * timeout. False while some are left (tried again on the next pass).
 */
async function dropLogTriggers(session: Session, s: string, log: Logger): Promise<boolean> {
  // A read first (no transaction, no lock): there are none on nearly every pass.
  const [left] = await session.query<{ any: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM pg_trigger g WHERE starts_with(g.tgname, 'trellis_log#')
                       AND NOT EXISTS (SELECT 1 FROM ${s}.redefine_logs l
                                        WHERE l.shadow_id::text = split_part(g.tgname, '#', 2))) AS any`,
  );
  if (!left?.any) return true;
  try {
    const remaining = await session.transaction(async () => {
      await session.query(`SET LOCAL lock_timeout = '${SWITCH_LOCK_TIMEOUT_MS}ms'`);
      const [row] = await session.query<{ n: number }>(
        `SELECT ${s}._redefine_log_cleanup($1::float8) AS n`,
        [SWITCH_LOCK_TIMEOUT_MS],
      );
      return Number(row?.n ?? 0);
    });
    if (remaining === 0) log.debug({}, "a redefinition's log triggers were dropped");
    return remaining === 0;
  } catch (error) {
    if (lockedOut(error)) return false;
    throw error;
  }
}
