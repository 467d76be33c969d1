import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';

/** With nothing new, a tick is still taken this often (awaitConverged waits for one). */
export const KEEPALIVE_TICK_MS = 250;

/**
 * Seals a segment: records pg_current_snapshot() as a new tick when captured changes have
 * committed since the last tick (or the last is older than the keepalive). Returns the
 * new tick's seq, or null when none was needed.
 *
 * Committed changes not covered by the last tick are exactly the ledger rows this
 * session can see whose xid the last tick's snapshot does not: rows of transactions
 * still running are invisible to us and wait for a later tick.
 */
export async function tick(session: Session, schema: string): Promise<number | null> {
  const s = quoteIdent(schema);
  // Scalar subqueries, not a join with the last tick: the bounds must be known to the
  // planner for the ledger's BRIN index to skip what the last tick already covered.
  const [row] = await session.query<{ seq: string | null }>(
    `INSERT INTO ${s}.ticks (seq, snap)
     SELECT nextval('${s.replaceAll("'", "''")}.tick_seq'), pg_current_snapshot()
      WHERE NOT EXISTS (SELECT 1 FROM ${s}.ticks)
         OR (SELECT max(at) FROM ${s}.ticks) < clock_timestamp() - make_interval(secs => $1::float8 / 1000)
         OR EXISTS (
              SELECT 1 FROM ${s}.ledger l
               WHERE l.xid >= (SELECT pg_snapshot_xmin(snap)::text::bigint FROM ${s}.ticks ORDER BY seq DESC LIMIT 1)
                 AND NOT pg_visible_in_snapshot(l.xid::text::xid8,
                       (SELECT snap FROM ${s}.ticks ORDER BY seq DESC LIMIT 1)))
     RETURNING seq`,
    [KEEPALIVE_TICK_MS],
  );
  return row?.seq == null ? null : Number(row.seq);
}
