import type { Session } from '../../db/session.js';
import { quoteIdent } from '../../identifiers.js';
import type { Logger } from '../../logger.js';
import { touchPublication } from './publication.js';

/**
 * WAL capture changed outside Trellis, or past what it may hold (ADR 0023): the staging
 * worker's checks on each pass (and `detectCaptureDisruptions()`). Returns the tables
 * whose changes may have been lost.
 *
 * - The publication dropped, renamed or its options changed, or a source taken out of it
 *   (or out and back in: its membership row is not the one Trellis made): changes of that
 *   source were not published meanwhile. The readers of a source captured from the WAL
 *   alone stop (`captureFailure.kind: 'disruption'`); the source goes back to publishing
 *   (a source whose triggers still ran lost nothing and just starts over).
 * - The slot dropped or invalidated by Postgres: see `_wal_lost` (the decoder acts too).
 * - The slot holding more WAL than the ceiling (`walRetentionLimit`): it is dropped as if
 *   lost, rather than fill the disk; RESUME rebuilds the readers once a new slot is ready.
 */
export async function detectWalDisruptions(
  session: Session,
  schema: string,
  log: Logger,
): Promise<string[]> {
  const s = quoteIdent(schema);
  const findings = await session.query<{
    id: number;
    qualified: string;
    lost: boolean;
    publication_changed: boolean;
    error: string;
  }>(
    `WITH pub AS (SELECT p.oid, p.pubname, p.xmin FROM pg_publication p WHERE p.pubname = ${s}._wal_publication()),
     cfg AS (SELECT * FROM ${s}.config)
     SELECT src.id, src.qualified,
            src.wal_state = 'ready' AND src.installed_at IS NULL AS lost,
            pub.oid IS NULL OR pub.xmin::text IS DISTINCT FROM cfg.wal_publication_xmin AS publication_changed,
            CASE
              WHEN pub.oid IS NULL THEN format('the publication %I of WAL capture was dropped outside Trellis', ${s}._wal_publication())
              WHEN pub.xmin::text IS DISTINCT FROM cfg.wal_publication_xmin
                THEN format('the publication %I of WAL capture was altered outside Trellis', pub.pubname)
              WHEN pr.oid IS NULL
                THEN format('%s was taken out of the publication %I outside Trellis', src.qualified, pub.pubname)
              ELSE format('%s was taken out of the publication %I and put back outside Trellis', src.qualified, pub.pubname)
            END AS error
       FROM ${s}.sources src
       CROSS JOIN cfg
       LEFT JOIN pub ON true
       LEFT JOIN pg_publication_rel pr ON pr.prpubid = pub.oid AND pr.prrelid = src.source_oid
      WHERE src.wal_state IS NOT NULL
        AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = src.source_oid)
        -- A restored or cloned catalog's publication and slot are another database's,
        -- forgotten when the staging worker rebinds it (_recognise_restore), not disrupted.
        AND ${s}._restore_reason() IS NULL
        AND (pub.oid IS NULL OR pub.xmin::text IS DISTINCT FROM cfg.wal_publication_xmin
             OR pr.oid IS NULL OR pr.xmin::text IS DISTINCT FROM src.wal_rel_xmin)`,
  );
  if (findings.length === 0) return [];
  // The publication as Trellis wants it again (it is made again by the decoder if gone).
  if (findings.some((f) => f.publication_changed)) {
    const [pub] = await session.query<{ name: string; present: boolean }>(
      `SELECT ${s}._wal_publication() AS name,
              EXISTS (SELECT 1 FROM pg_publication WHERE pubname = ${s}._wal_publication()) AS present`,
    );
    if (pub?.present) await touchPublication(session, schema, pub.name);
    else await session.query(`UPDATE ${s}.config SET wal_publication_xmin = NULL`);
  }
  const stopped = await session.query<{ target: string }>(
    `WITH found AS (SELECT f.*, f.id = ANY ($3::int[]) AS lost FROM unnest($1::int[], $2::text[]) AS f(id, error)),
     reset AS (
       UPDATE ${s}.sources src
          SET wal_state = NULL, wal_xmax = NULL, wal_since = NULL, wal_rel_xmin = NULL
        WHERE src.id IN (SELECT id FROM found)
       RETURNING src.id),
     readers AS (
       SELECT DISTINCT ON (ts.transform_id) ts.transform_id, f.error
         FROM found f JOIN ${s}.sources src ON src.id = f.id
         JOIN ${s}.transform_sources ts ON ts.source_oid = src.source_oid
        WHERE f.lost
        ORDER BY ts.transform_id, f.id)
     UPDATE ${s}.transforms t
        SET paused_at = coalesce(t.paused_at, now()),
            pause_reason = CASE WHEN t.paused_at IS NULL THEN 'disruption' ELSE t.pause_reason END,
            capture_failure = jsonb_build_object('kind', 'disruption', 'error', r.error,
                                                 'columns', '[]'::jsonb, 'detected_at', now()),
            updated_at = now()
       FROM readers r
      WHERE t.id = r.transform_id AND t.capture_failure IS NULL
     RETURNING t.target_name AS target`,
    [
      findings.map((f) => f.id),
      findings.map((f) => f.error),
      findings.filter((f) => f.lost).map((f) => f.id),
    ],
  );
  for (const f of findings)
    log.warn({ table: f.qualified, lost: f.lost }, `capture disrupted: ${f.error}`);
  for (const { target } of stopped) {
    log.warn({ target }, `transform ${target} stopped: WAL capture was disrupted`);
  }
  return findings.filter((f) => f.lost).map((f) => f.qualified);
}

/**
 * The slot against its ceiling, and whether it is still there: past the ceiling it is
 * dropped (its WAL sender ended first) and treated as lost; a slot dropped or invalidated
 * outside Trellis is lost. Returns the targets stopped.
 */
export async function checkSlot(session: Session, schema: string, log: Logger): Promise<string[]> {
  const s = quoteIdent(schema);
  const [slot] = await session.query<{
    name: string;
    present: boolean;
    status: string | null;
    pid: number | null;
    retained: string | null;
    limit: string;
  }>(
    `SELECT c.wal_slot AS name, rs.slot_name IS NOT NULL AS present, rs.wal_status AS status,
            rs.active_pid AS pid, c.wal_retention_limit::text AS limit,
            pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint::text AS retained
       FROM ${s}.config c
       LEFT JOIN pg_replication_slots rs ON rs.slot_name = c.wal_slot AND rs.database = current_database()
      WHERE c.wal_slot IS NOT NULL`,
  );
  if (!slot) return [];
  let reason: string | undefined;
  if (!slot.present) {
    reason = `replication slot ${slot.name} does not exist on this server (a promoted standby or a restored backup?), or was dropped outside Trellis: changes it had not delivered are lost`;
  } else if (slot.status === 'lost') {
    reason = `replication slot ${slot.name} was invalidated by Postgres (wal_status lost: it held more WAL than max_slot_wal_keep_size allows): changes it had not delivered are lost`;
  } else if (slot.retained !== null && BigInt(slot.retained) > BigInt(slot.limit)) {
    reason = `replication slot ${slot.name} held ${slot.retained} bytes of WAL, over the ceiling of ${slot.limit} (walRetentionLimit): it was dropped so as not to fill the disk, and changes it had not delivered are lost`;
  }
  if (reason === undefined) return [];
  const stopped = await session.query<{ target: string }>(
    `SELECT t AS target FROM ${s}._wal_lost($1, $2) t`,
    [slot.name, reason],
  );
  if (slot.present) {
    // Dropped here rather than left to the decoder: a slot past its ceiling is what fills
    // the disk. Its WAL sender (the decoder's stream) is ended first.
    if (slot.pid !== null) await session.query('SELECT pg_terminate_backend($1)', [slot.pid]);
    await session
      .query(
        `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
          WHERE slot_name = $1 AND database = current_database() AND NOT active`,
        [slot.name],
      )
      .catch(() => undefined); // Still active a moment after the terminate: the decoder drops it.
  }
  log.warn({ slot: slot.name, stopped: stopped.map((r) => r.target) }, reason);
  return stopped.map((r) => r.target);
}
