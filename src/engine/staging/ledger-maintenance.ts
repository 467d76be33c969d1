import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import { EPOCH_BITS, GENERATIONS } from '../internal/ledger.js';
import type { Logger } from '../logger.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';

/**
 * The oldest tick some transform still reads from: its cursor (or the newest tick when no
 * transform has one). Ledger rows and ticks older than that are never read again.
 */
const OLDEST_NEEDED_TICK = (s: string) => `coalesce(
  (SELECT min(cursor_tick) FROM ${s}.pipeline WHERE cursor_tick IS NOT NULL),
  (SELECT max(seq) FROM ${s}.ticks))`;

/**
 * Keeps the ledger small without DELETE, and prunes old ticks. Each step is its own short
 * transaction. What it can free depends only on the oldest cursor (and its tick), so the
 * staging worker runs it when that moved (or a TRUNCATE was left for later).
 *
 * Rows go to generation `(xid >> 16) % 3`, so transactions move on to the next generation
 * every 65,536 xids. A generation other than the current epoch's holds only rows of
 * epochs that have ended; once the oldest tick any transform still reads from has an xmin
 * past the end of the latest of them, every transaction that wrote there has ended and
 * every cursor has passed its rows: the partition is TRUNCATEd. A paused transform holds
 * its cursor, and with it truncation; so does a long-running transaction.
 */
export interface MaintenanceResult {
  /** The oldest cursor (`<schema>._cursor_floor()`) this pass worked from. */
  floor: string | null;
  /** A generation due for TRUNCATE was left for a later pass (its lock was not free). */
  skipped: boolean;
}

export async function maintainLedger(
  session: Session,
  schema: string,
  log: Logger,
): Promise<MaintenanceResult> {
  const s = quoteIdent(schema);
  const [state] = await session.query<{
    next_xid: string;
    oldest_xmin: string | null;
    floor: string | null;
  }>(
    `SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS next_xid,
            (SELECT pg_snapshot_xmin(snap)::text FROM ${s}.ticks WHERE seq = ${OLDEST_NEEDED_TICK(s)}) AS oldest_xmin,
            ${s}._cursor_floor()::text AS floor`,
  );
  let skipped = false;
  if (state?.oldest_xmin != null) {
    const epoch = BigInt(state.next_xid) >> BigInt(EPOCH_BITS);
    const oldestXmin = BigInt(state.oldest_xmin);
    for (let gen = 0; gen < GENERATIONS; gen += 1) {
      const generation = BigInt(gen);
      if (epoch % BigInt(GENERATIONS) === generation) continue;
      // The latest epoch that wrote to this generation, and the first xid after it.
      const latest = epoch - ((epoch - generation) % BigInt(GENERATIONS));
      const end = (latest + 1n) << BigInt(EPOCH_BITS);
      if (oldestXmin >= end && !(await truncateGeneration(session, schema, gen, log))) {
        skipped = true;
      }
    }
  }
  await session.query(
    `DELETE FROM ${s}.ticks WHERE seq < ${OLDEST_NEEDED_TICK(s)} AND seq < (SELECT max(seq) FROM ${s}.ticks)`,
  );
  return { floor: state?.floor ?? null, skipped };
}

/** Truncates a generation; false when its lock was not free (a later pass tries again). */
async function truncateGeneration(
  session: Session,
  schema: string,
  gen: number,
  log: Logger,
): Promise<boolean> {
  const partition = `${quoteIdent(schema)}.${quoteIdent(`ledger_${gen}`)}`;
  const [rows] = await session.query<{ any: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM ${partition}) AS any`,
  );
  if (!rows?.any) return true;
  try {
    await session.transaction(async () => {
      // Drains read the ledger through its parent and so lock every partition for a moment:
      // wait briefly, and try again on a later pass rather than queue writers behind us.
      await session.query(`SET LOCAL lock_timeout = '100ms'`);
      await session.query(`TRUNCATE ${partition}`);
    });
    log.debug({ gen }, 'ledger generation truncated');
    return true;
  } catch (error) {
    if (sqlstateOf(error) !== SQLSTATE.lockNotAvailable) throw error;
    return false;
  }
}
