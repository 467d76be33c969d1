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
 */
export async function startBackfills(session: Session, schema: string): Promise<string[]> {
  const s = quoteIdent(schema);
  const rows = await session.query<{ target: string }>(
    `WITH t0 AS (SELECT seq, snap FROM ${s}.ticks ORDER BY seq DESC LIMIT 1),
     ready AS (
       SELECT t.id, t.target_name
         FROM ${s}.transforms t
         JOIN ${s}.pipeline p ON p.transform_id = t.id
        WHERE p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL
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
                    OR src.ready_xmax > (SELECT pg_snapshot_xmin(snap) FROM t0)))
        FOR UPDATE OF p SKIP LOCKED)
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
  );
  return rows.map((r) => r.target);
}
