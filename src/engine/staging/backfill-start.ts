import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';

/**
 * Moves transforms from waiting_to_backfill to backfilling once capture of every source
 * covers what they read, setting their cursor to the newest tick T0. Every change after
 * T0 reaches them through the ledger; everything before is read by the backfill, which
 * starts after T0, so chunks need no shared snapshot.
 *
 * Under WAL capture (ADR 0023), a source is covered once it is `ready`: every transaction
 * that could write it unpublished has ended, so every change the chunks do not read is
 * decoded into the ledger.
 *
 * A change the triggers did not capture must be committed before the chunks read its
 * row: so a transform reading a column a widen added also waits until the transactions
 * that may still run the older UPDATE trigger have ended (`widened_at`, cleared by
 * widen-wait.ts once it saw them gone, before this statement and so before any chunk). A
 * `ready_xmax` an older trellis-pg set after a widen is still honoured: T0's xmin past it.
 *
 * The pipeline rows are locked first and the coverage is read in a second statement:
 * in one statement, a row updated after its snapshot (ALTER TRANSFORM … ADD COLUMN widens
 * what the transform reads and requests a rebuild in one transaction) is re-checked on
 * its own columns only, while the coverage subquery still reads the old snapshot, and a
 * build could start before the widened capture covers it. Under the lock, the second
 * statement's snapshot sees every change that committed before it; one that has not
 * committed yet updates the pipeline row too, so it waits and then sends the build back.
 */
export async function startBackfills(session: Session, schema: string): Promise<string[]> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    const locked = await session.query<{ id: number }>(
      `SELECT p.transform_id AS id
         FROM ${s}.pipeline p JOIN ${s}.transforms t ON t.id = p.transform_id
        WHERE p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL
        FOR UPDATE OF p SKIP LOCKED`,
    );
    if (locked.length === 0) return [];
    const rows = await session.query<{ target: string }>(
      `WITH t0 AS (SELECT seq, snap FROM ${s}.ticks ORDER BY seq DESC LIMIT 1),
     ready AS (
       SELECT t.id, t.target_name
         FROM ${s}.transforms t
         JOIN ${s}.pipeline p ON p.transform_id = t.id
        WHERE p.transform_id = ANY($1::int[])
          AND p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL
          AND NOT EXISTS (
            SELECT 1 FROM ${s}.transform_sources ts
              LEFT JOIN ${s}.sources src ON src.source_oid = ts.source_oid
             WHERE ts.transform_id = t.id
               AND (src.id IS NULL
                    -- WAL capture that is ready covers every column; else the triggers must.
                    OR (src.wal_state IS DISTINCT FROM 'ready'
                        AND (src.installed_at IS NULL
                             OR NOT (ARRAY(SELECT unnest(ts.read_columns) EXCEPT SELECT unnest(ts.key_columns))
                                     <@ src.captured_columns)
                             OR (src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns)))
                    OR src.ready_xmax > (SELECT pg_snapshot_xmin(snap) FROM t0))))
     UPDATE ${s}.pipeline p
        SET phase = 'backfilling', cursor_tick = (SELECT seq FROM t0),
            backfill_position = NULL, backfill_stage = 'rows', backfill_done = 0, backfill_started_at = now(),
            backfill_total = (
              SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END
                FROM ${s}.transform_sources ts JOIN pg_class c ON c.oid = ts.source_oid
               WHERE ts.transform_id = p.transform_id AND ts.ordinal = 0),
            open_lo = NULL, open_hi = NULL, open_pages = NULL, pages_left = NULL,
            updated_at = now()
       FROM ready
      WHERE p.transform_id = ready.id AND EXISTS (SELECT 1 FROM t0)
     RETURNING ready.target_name AS target`,
      [locked.map((r) => r.id)],
    );
    return rows.map((r) => r.target);
  });
}
