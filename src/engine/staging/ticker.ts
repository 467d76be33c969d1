import type { Session } from '../db/session.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';

/**
 * While some transform waits for a newer tick to move on (a backfill for its start tick,
 * a finished backfill to go live), a tick is taken this often even with nothing written.
 */
export const KEEPALIVE_TICK_MS = 250;

export interface TickResult {
  /** The new tick's seq, or null when none was needed. */
  seq: number | null;
  /** Some transform was waiting for a newer tick (a backfill can start now). */
  waiting: boolean;
  /** What capture depends on now (`<schema>._capture_fingerprint()`), when asked for. */
  fingerprint: string | null;
  /** The oldest cursor now (`<schema>._cursor_floor()`). */
  floor: string | null;
}

/**
 * Seals a segment: records pg_current_snapshot() as a new tick when captured changes have
 * committed since the last tick, when there is no tick yet, or (every KEEPALIVE_TICK_MS)
 * when a transform waits for one (`<schema>._tick_needed`). With nothing written and
 * nothing waiting, no tick is taken. In the same statement, what the staging worker
 * checks between ticks while writes keep coming (and so it does not wait for them): a
 * transform waiting for a tick, what capture depends on, and the oldest cursor.
 *
 * Committed changes not covered by the last tick are exactly the ledger rows this
 * session can see whose xid the last tick's snapshot does not: rows of transactions
 * still running are invisible to us and wait for a later tick.
 */
export async function tick(
  session: Session,
  schema: string,
  withFingerprint: boolean,
): Promise<TickResult> {
  const s = quoteIdent(schema);
  const [row] = await session.query<{
    seq: string | null;
    waiting: boolean;
    fingerprint: string | null;
    floor: string | null;
  }>(
    `WITH t AS (
       INSERT INTO ${s}.ticks (seq, snap)
       SELECT nextval(${quoteLiteral(`${s}.tick_seq`)}), pg_current_snapshot()
        WHERE ${s}._tick_needed($1)
       RETURNING seq)
     SELECT (SELECT seq FROM t) AS seq, ${s}._waiting_for_tick() AS waiting,
            CASE WHEN $2 THEN ${s}._capture_fingerprint() END AS fingerprint,
            ${s}._cursor_floor()::text AS floor`,
    [KEEPALIVE_TICK_MS, withFingerprint],
  );
  return {
    seq: row?.seq == null ? null : Number(row.seq),
    waiting: row?.waiting === true,
    fingerprint: row?.fingerprint ?? null,
    floor: row?.floor ?? null,
  };
}
