import { dropTriggersSql } from '../capture/trigger-sql.js';
import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';

/** Keys a correction puts into the ledger per step (one transaction each). */
export const CORRECTION_CHUNK = 10_000;

/**
 * Rows that arrive or leave a source without DML (issue #9, ADR 0010): ATTACH / DETACH
 * PARTITION, INHERIT / NO INHERIT. Each reconcile pass compares a captured source's
 * members (partitions and children, every level) with those it recorded:
 * - a member that came (attached, or created) is corrected: its keys go into the ledger
 *   as changes of the source, and the drain re-derives them;
 * - a member that went but still exists (detached) is corrected the same way (its rows
 *   are gone from the source), and loses its capture triggers;
 * - a member that went and no longer exists (a partition dropped: no DELETE fires) leaves
 *   no keys to re-derive: the source's readers are rebuilt.
 * While corrections are queued, readers report `backfilling` and `status().correcting`
 * lists them; `awaitConverged` waits for them (`_sources_settled`).
 */
export async function trackMembers(session: Session, schema: string, log: Logger): Promise<void> {
  const s = quoteIdent(schema);
  await session.transaction(async () => {
    // Members that left a WAL-captured source, once everything before their leaving is
    // decoded.
    await session.query(
      `DELETE FROM ${s}.source_members WHERE left_lsn IS NOT NULL AND ${s}._wal_decoded(left_lsn)`,
    );
    // Sources installed before members were recorded: what they have now is the baseline.
    await session.query(
      `SELECT ${s}._record_members(id) FROM ${s}.sources
        WHERE installed_at IS NOT NULL AND members_at IS NULL AND to_regclass(source_oid::text) IS NOT NULL`,
    );
    const changes = await session.query<{
      source_id: number;
      relid: string;
      came: boolean;
      node: string | null;
      storage: boolean;
      wal: boolean;
    }>(
      `WITH watched AS (
         SELECT src.id, src.source_oid FROM ${s}.sources src
          WHERE src.members_at IS NOT NULL AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = src.source_oid)),
       now_members AS (
         SELECT w.id, d AS relid FROM watched w, ${s}._descendants(w.source_oid) d),
       -- Members that left a WAL-captured source stay recorded (left_lsn) until the slot
       -- decoded past their leaving: they are gone already, and come back only if they
       -- come back.
       kept AS (
         SELECT m.source_id, m.relid FROM ${s}.source_members m JOIN watched w ON w.id = m.source_id
          WHERE m.left_lsn IS NULL),
       changes AS (
         (SELECT id, relid, true AS came FROM now_members
          EXCEPT SELECT source_id, relid, true FROM kept)
         UNION ALL
         (SELECT source_id, relid, false FROM kept
          EXCEPT SELECT id, relid, false FROM now_members))
       SELECT ch.id AS source_id, ch.relid::text AS relid, ch.came,
              (SELECT src.wal_state IS NOT NULL FROM ${s}.sources src WHERE src.id = ch.id) AS wal,
              quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS node,
              coalesce(c.relkind IN ('r', 'm'), false) AS storage
         FROM changes ch
         LEFT JOIN pg_class c ON c.oid = ch.relid LEFT JOIN pg_namespace n ON n.oid = c.relnamespace`,
    );
    for (const change of changes) {
      await session.query(`UPDATE ${s}.sources SET members_changed_at = now() WHERE id = $1`, [
        change.source_id,
      ]);
      if (change.came) {
        await session.query(
          `INSERT INTO ${s}.source_members (source_id, relid) VALUES ($1, $2::oid)
           ON CONFLICT (source_id, relid) DO UPDATE SET left_lsn = NULL`,
          [change.source_id, change.relid],
        );
      } else if (change.wal && change.node !== null) {
        // Its changes from before it left may not be decoded yet: they still map to the
        // source until the slot has passed this position (ADR 0023).
        await session.query(
          `UPDATE ${s}.source_members SET left_lsn = pg_current_wal_insert_lsn()
            WHERE source_id = $1 AND relid = $2::oid`,
          [change.source_id, change.relid],
        );
      } else {
        await session.query(
          `DELETE FROM ${s}.source_members WHERE source_id = $1 AND relid = $2::oid`,
          [change.source_id, change.relid],
        );
      }
      if (change.node === null) {
        // Dropped with its rows, and no trigger saw them go: rebuild the readers.
        await session.query(
          `SELECT ${s}._request_rebuild(ts.transform_id)
             FROM ${s}.transform_sources ts JOIN ${s}.sources src ON src.source_oid = ts.source_oid
            WHERE src.id = $1`,
          [change.source_id],
        );
        log.info(
          { source_id: change.source_id },
          'a partition was dropped: its readers are rebuilt',
        );
        continue;
      }
      if (!change.storage) continue;
      await session.query(
        `INSERT INTO ${s}.corrections (source_id, relid, node, keys_total)
         SELECT $1, $2::oid, $3, CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END
           FROM pg_class c WHERE c.oid = $2::oid
         ON CONFLICT (source_id, relid) DO UPDATE
           SET position = NULL, keys_done = 0, since = now(), keys_total = EXCLUDED.keys_total`,
        [change.source_id, change.relid, change.node],
      );
      log.info(
        { node: change.node, came: change.came },
        `rows ${change.came ? 'came' : 'went'} without DML: correcting ${change.node}`,
      );
      if (!change.came) await dropCapture(session, schema, change.node);
    }
  });
}

/** A detached node keeps the capture triggers it had as a member: they go (best effort). */
async function dropCapture(session: Session, schema: string, table: string): Promise<void> {
  try {
    await session.query('SAVEPOINT trellis_detached');
    await session.query(`SET LOCAL lock_timeout = '100ms'`);
    for (const sql of dropTriggersSql({ schema, table })) await session.query(sql);
    await session.query('RELEASE SAVEPOINT trellis_detached');
  } catch (error) {
    await session.query('ROLLBACK TO SAVEPOINT trellis_detached');
    if (sqlstateOf(error) !== SQLSTATE.lockNotAvailable) throw error;
  }
}

/**
 * One step of one queued correction: the next chunk of the node's keys (in key order)
 * into the ledger, as changes of its source. Returns whether there was one.
 */
export async function correctionStep(session: Session, schema: string): Promise<boolean> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    const [c] = await session.query<{
      source_id: number;
      relid: string;
      position: string[] | null;
      key_columns: string[];
      key_types: string[];
    }>(
      `SELECT c.source_id, c.relid::text AS relid, c.position, src.key_columns, src.key_types
         FROM ${s}.corrections c JOIN ${s}.sources src ON src.id = c.source_id
        ORDER BY c.since LIMIT 1 FOR UPDATE OF c SKIP LOCKED`,
    );
    if (!c) return false;
    const [node] = await session.query<{ name: string | null }>(
      `SELECT quote_ident(n.nspname) || '.' || quote_ident(r.relname) AS name
         FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = $1::oid`,
      [c.relid],
    );
    if (!node?.name) {
      // Gone since: nothing left to read (a rebuild covers a dropped member).
      await session.query(`DELETE FROM ${s}.corrections WHERE source_id = $1 AND relid = $2::oid`, [
        c.source_id,
        c.relid,
      ]);
      return true;
    }
    // Keys as capture writes them (its functions pin these for setting-dependent types).
    await session.query(
      `SELECT set_config('datestyle', 'ISO, YMD', true), set_config('intervalstyle', 'postgres', true),
              set_config('extra_float_digits', '3', true), set_config('bytea_output', 'hex', true)`,
    );
    const keys = c.key_columns.map((k) => `r.${quoteIdent(k)}`);
    const tuple = (items: string[]) => (items.length === 1 ? items[0]! : `(${items.join(', ')})`);
    const typed = c.key_types.map((type, i) => `(($1::text[])[${i + 1}])::${type}`);
    const encoded =
      keys.length === 1
        ? `${keys[0]}::text`
        : `ARRAY[${keys.map((k) => `${k}::text`).join(', ')}]::text`;
    const [step] = await session.query<{ n: number; last: string[] | null }>(
      `WITH chunk AS (
         SELECT ${encoded} AS k, ARRAY[${keys.map((k) => `${k}::text`).join(', ')}] AS raw,
                row_number() OVER (ORDER BY ${keys.join(', ')}) AS rn
           FROM ONLY ${node.name} r
          WHERE $1::text[] IS NULL OR ${tuple(keys)} > ${tuple(typed)}
          ORDER BY ${keys.join(', ')}
          LIMIT ${CORRECTION_CHUNK}),
       added AS (
         INSERT INTO ${s}.ledger (gen, source_id, xid, keys)
         SELECT ${s}.ledger_generation(x.xid), $2, x.xid, array_agg(chunk.k)
           FROM chunk, (SELECT pg_current_xact_id()::text::bigint AS xid) x
          GROUP BY x.xid
         RETURNING 1)
       SELECT (SELECT count(*) FROM chunk)::int AS n,
              (SELECT raw FROM chunk ORDER BY rn DESC LIMIT 1) AS last`,
      [c.position, c.source_id],
    );
    const n = step?.n ?? 0;
    if (n < CORRECTION_CHUNK) {
      await session.query(`DELETE FROM ${s}.corrections WHERE source_id = $1 AND relid = $2::oid`, [
        c.source_id,
        c.relid,
      ]);
    } else {
      await session.query(
        `UPDATE ${s}.corrections SET position = $3, keys_done = keys_done + $4
          WHERE source_id = $1 AND relid = $2::oid`,
        [c.source_id, c.relid, step?.last, n],
      );
    }
    return true;
  });
}
