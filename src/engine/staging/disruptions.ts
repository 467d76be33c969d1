import { CAPTURE_EVENTS, triggerName } from '../capture/trigger-sql.js';
import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';

/**
 * Capture changed outside Trellis (issue #9, ADR 0010): a capture trigger disabled
 * (`DISABLE TRIGGER ALL`, `pg_restore --disable-triggers`), enabled again in any mode but
 * ALWAYS (`ENABLE TRIGGER ALL` leaves origin mode), dropped, or pointed at another
 * function, or a capture function replaced. The rows written meanwhile never reached the
 * ledger: every transform reading the table stops (`captureFailure.kind: 'disruption'`),
 * and the staging worker installs capture again (the source is marked not installed).
 * RESUME then rebuilds. One catalog query for every captured source (and its partitions
 * and children that have capture).
 *
 * Returns the disrupted tables, schema-qualified.
 */
export async function detectDisruptions(
  session: Session,
  schema: string,
  log: Logger,
): Promise<string[]> {
  const s = quoteIdent(schema);
  const names = CAPTURE_EVENTS.map((event) => triggerName(schema, event));
  // A source captured before its digest was recorded (by a trellis-pg older than migration
  // 0012, or one still running against a newer schema) has none: the functions as they
  // are now are recorded, not taken for a disruption (issue #21 item 4, ADR 0036).
  await session.query(
    `UPDATE ${s}.sources SET capture_digest = ${s}._capture_digest(id)
      WHERE installed_at IS NOT NULL AND capture_digest IS NULL`,
  );
  const rows = await session.query<{ source_id: number; tables: string[]; error: string }>(
    `WITH captured AS (
       SELECT src.id, src.source_oid, src.capture_digest,
              quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS root
         FROM ${s}.sources src
         JOIN pg_class c ON c.oid = src.source_oid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE src.installed_at IS NOT NULL),
     tables AS (
       -- The source, and its partitions and children that have some capture trigger (one
       -- with none is new: the reconcile pass captures it).
       SELECT cap.id, cap.source_oid AS relid, true AS root FROM captured cap
       UNION ALL
       SELECT cap.id, d.relid, false FROM captured cap
        CROSS JOIN LATERAL (
          WITH RECURSIVE tree(relid) AS (
            SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = cap.source_oid
            UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
          SELECT relid FROM tree) d
        WHERE EXISTS (SELECT 1 FROM pg_trigger tg WHERE tg.tgrelid = d.relid AND tg.tgname = ANY ($1::name[]))),
     findings AS (
       SELECT t.id, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS tbl,
              CASE WHEN tg.oid IS NULL THEN format('capture trigger %I on %I.%I was dropped', e.name, n.nspname, c.relname)
                   WHEN tg.tgenabled = 'D' THEN format('capture trigger %I on %I.%I was disabled', e.name, n.nspname, c.relname)
                   WHEN tg.tgenabled <> 'A' THEN format(
                     'capture trigger %I on %I.%I was enabled again without ALWAYS (writes in replication mode would not be captured, and it was disabled before)',
                     e.name, n.nspname, c.relname)
                   ELSE format('capture trigger %I on %I.%I calls another function than the one Trellis made', e.name, n.nspname, c.relname)
              END AS error
         FROM tables t
         JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
         CROSS JOIN LATERAL unnest($1::name[], $2::text[]) AS e(name, event)
         LEFT JOIN pg_trigger tg ON tg.tgrelid = t.relid AND tg.tgname = e.name
        WHERE tg.oid IS NULL OR tg.tgenabled <> 'A'
           OR tg.tgfoid IS DISTINCT FROM to_regprocedure(format('%I.%I()', $3::text, format('capture_%s_%s', t.id, e.event)))
       UNION ALL
       SELECT cap.id, cap.root, format('capture functions of %s were replaced or dropped outside Trellis', cap.root)
         FROM captured cap
        WHERE ${s}._capture_digest(cap.id) IS DISTINCT FROM cap.capture_digest)
     SELECT f.id AS source_id, array_agg(DISTINCT f.tbl) AS tables,
            (array_agg(f.error ORDER BY f.tbl, f.error))[1]
              || CASE WHEN count(*) > 1 THEN format(' (and %s more)', count(*) - 1) ELSE '' END AS error
       FROM findings f GROUP BY f.id`,
    [names, [...CAPTURE_EVENTS], schema],
  );
  if (rows.length === 0) return [];
  const ids = rows.map((r) => r.source_id);
  const stopped = await session.query<{ target: string }>(
    `WITH disrupted AS (
       SELECT * FROM unnest($1::int[], $2::text[]) AS d(source_id, error)),
     readers AS (
       SELECT DISTINCT ON (ts.transform_id) ts.transform_id, d.error
         FROM disrupted d
         JOIN ${s}.sources src ON src.id = d.source_id
         JOIN ${s}.transform_sources ts ON ts.source_oid = src.source_oid
        ORDER BY ts.transform_id, d.source_id),
     marked AS (
       UPDATE ${s}.sources SET installed_at = NULL WHERE id = ANY ($1::int[]) RETURNING id)
     UPDATE ${s}.transforms t
        SET paused_at = coalesce(t.paused_at, now()),
            -- An operator's pause stays theirs; RESUME rebuilds whatever the reason.
            pause_reason = CASE WHEN t.paused_at IS NULL THEN 'disruption' ELSE t.pause_reason END,
            capture_failure = jsonb_build_object('kind', 'disruption', 'error', r.error,
                                                 'columns', '[]'::jsonb, 'detected_at', now()),
            updated_at = now()
       FROM readers r
      WHERE t.id = r.transform_id AND t.capture_failure IS NULL
     RETURNING t.target_name AS target`,
    [ids, rows.map((r) => r.error)],
  );
  for (const row of rows) {
    log.warn({ tables: row.tables, error: row.error }, `capture disrupted: ${row.error}`);
  }
  // The pause itself is logged once, as a state change, by the catalog watch.
  for (const { target } of stopped) {
    log.debug({ target }, `transform ${target} stopped: capture was disrupted`);
  }
  return [...new Set(rows.flatMap((r) => r.tables))].sort();
}
