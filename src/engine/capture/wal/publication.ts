import type { Session } from '../../db/session.js';
import { quoteIdent } from '../../identifiers.js';
import type { Logger } from '../../logger.js';

/** What a publication of WAL capture publishes (ADR 0023). */
export const PUBLICATION_OPTIONS =
  "publish = 'insert, update, delete, truncate', publish_via_partition_root = false";

/** The instance's WAL capture as the staging worker's reconcile pass sees it. */
export interface WalCaptureState {
  capture: 'trigger' | 'logical';
  publication: string;
  /** A slot exists and the publication too: sources may be published. */
  ready: boolean;
}

export async function readWalCaptureState(
  session: Session,
  schema: string,
): Promise<WalCaptureState> {
  const s = quoteIdent(schema);
  const [row] = await session.query<{
    capture: 'trigger' | 'logical';
    publication: string;
    ready: boolean;
  }>(
    `SELECT c.capture, ${s}._wal_publication() AS publication,
            c.wal_slot IS NOT NULL
              AND EXISTS (SELECT 1 FROM pg_publication WHERE pubname = ${s}._wal_publication()) AS ready
       FROM ${s}.config c`,
  );
  return row!;
}

/**
 * Adds a source to the publication (in the caller's transaction, which holds the lock
 * ALTER PUBLICATION takes): from its commit, changes of transactions whose first change
 * follows are published; the source is `publishing` until every transaction running then
 * has ended (`recordPublishXmax`, after the commit, then `settlePublished`). Its members
 * are recorded now if they never were (partition corrections compare with them).
 */
export async function addToPublication(
  session: Session,
  schema: string,
  publication: string,
  sourceId: number,
  table: string,
): Promise<void> {
  const s = quoteIdent(schema);
  const [member] = await session.query<{ member: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
                     WHERE p.pubname = $1 AND r.prrelid = $2::regclass) AS member`,
    [publication, table],
  );
  if (!member?.member) {
    await session.query(`ALTER PUBLICATION ${quoteIdent(publication)} ADD TABLE ${table}`);
  }
  await session.query(
    `UPDATE ${s}.sources src
        SET wal_state = 'publishing', wal_since = now(), wal_xmax = NULL, wait = NULL,
            wal_rel_xmin = (SELECT r.xmin::text FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
                             WHERE p.pubname = $2 AND r.prrelid = src.source_oid)
      WHERE id = $1`,
    [sourceId, publication],
  );
  await session.query(
    `SELECT ${s}._record_members(id) FROM ${s}.sources WHERE id = $1 AND members_at IS NULL`,
    [sourceId],
  );
}

/**
 * After the publication change committed: the transactions to wait out are those a
 * snapshot taken now still counts as running, or that will get an xid below its xmax.
 */
export async function recordPublishXmax(
  session: Session,
  schema: string,
  sourceId: number,
): Promise<void> {
  await session.query(
    `UPDATE ${quoteIdent(schema)}.sources SET wal_xmax = pg_snapshot_xmax(pg_current_snapshot())
      WHERE id = $1 AND wal_state = 'publishing'`,
    [sourceId],
  );
}

/**
 * Takes a source out of the publication (in the caller's transaction). Its changes until
 * then are still decoded (decoding reads the catalog as of each change); the slot may go
 * only once it has acknowledged the WAL written so far (`recordDrainLsn`).
 */
export async function removeFromPublication(
  session: Session,
  schema: string,
  publication: string,
  sourceId: number,
  table: string | null,
): Promise<void> {
  const s = quoteIdent(schema);
  if (table !== null) {
    const [member] = await session.query<{ member: boolean; plain: boolean }>(
      `SELECT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
                       WHERE p.pubname = $1 AND r.prrelid = $2::regclass) AS member,
              (SELECT relkind = 'r' FROM pg_class WHERE oid = $2::regclass) AS plain`,
      [publication, table],
    );
    if (member?.member) {
      // ONLY: DROP TABLE would take inheritance children (which made the table leave WAL
      // capture, and were never members) along, and fail on them.
      await session.query(
        `ALTER PUBLICATION ${quoteIdent(publication)} DROP TABLE ${member.plain ? 'ONLY ' : ''}${table}`,
      );
    }
  }
  await session.query(
    `UPDATE ${s}.sources
        SET wal_state = NULL, wal_xmax = NULL, wal_since = NULL, wal_rel_xmin = NULL, wait = NULL
      WHERE id = $1`,
    [sourceId],
  );
}

/** After a source left the publication: the slot may go once it acknowledged this far. */
export async function recordDrainLsn(session: Session, schema: string): Promise<void> {
  await session.query(
    `UPDATE ${quoteIdent(schema)}.config
        SET wal_drain_lsn = greatest(coalesce(wal_drain_lsn, '0/0'::pg_lsn), pg_current_wal_insert_lsn())`,
  );
}

/**
 * Marks `ready` every publishing source whose wait is over (no transaction of this database
 * below its wal_xmax still runs: every one that could write it unpublished has ended), in the
 * transaction that touches the publication: changing its row makes every walsender drop
 * what it cached about which tables are published, which an older transaction decoded
 * under the old catalog may have left wrong (Postgres before 15.13, 16.9, 17.5). Returns
 * the tables made ready.
 */
export async function settlePublished(
  session: Session,
  schema: string,
  publication: string,
  log: Logger,
): Promise<string[]> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    const due = await session.query<{ id: number; qualified: string }>(
      `SELECT id, qualified FROM ${s}.sources
        WHERE wal_state = 'publishing' AND wal_xmax IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM ${s}._publish_waits_on(wal_xmax))
        FOR UPDATE`,
    );
    if (due.length === 0) return [];
    await touchPublication(session, schema, publication);
    await session.query(`UPDATE ${s}.sources SET wal_state = 'ready' WHERE id = ANY ($1::int[])`, [
      due.map((d) => d.id),
    ]);
    for (const d of due) log.info({ table: d.qualified }, 'WAL capture ready');
    return due.map((d) => d.qualified);
  });
}

/** Rewrites the publication's options (as Trellis wants them) and records its row's xmin. */
export async function touchPublication(
  session: Session,
  schema: string,
  publication: string,
): Promise<void> {
  await session.query(`ALTER PUBLICATION ${quoteIdent(publication)} SET (${PUBLICATION_OPTIONS})`);
  await session.query(
    `UPDATE ${quoteIdent(schema)}.config
        SET wal_publication_xmin = (SELECT xmin::text FROM pg_publication WHERE pubname = $1)`,
    [publication],
  );
}
