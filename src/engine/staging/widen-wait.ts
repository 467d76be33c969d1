import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';

/**
 * Lock modes a transaction writing a table holds on it: ROW EXCLUSIVE (what INSERT, UPDATE
 * and DELETE take) and every stronger mode.
 */
export const WRITER_LOCK_MODES = [
  'RowExclusiveLock',
  'ShareUpdateExclusiveLock',
  'ShareLock',
  'ShareRowExclusiveLock',
  'ExclusiveLock',
  'AccessExclusiveLock',
];

/**
 * The relation `param` (an oid) with its partitions and inheritance children at every
 * level, as a subquery of relids: capture covers them all (their writers fire its
 * triggers), and LOCK TABLE on the source locks them all.
 */
export function withDescendantsSql(param: string): string {
  return `(WITH RECURSIVE tree(relid) AS (
             SELECT ${param}::oid
             UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
           SELECT relid FROM tree)`;
}

/** A transaction a widen waits on, as pg_locks shows it (pid null: a prepared transaction). */
export interface WidenHolder {
  vxid: string;
  pid: number | null;
}

/**
 * Marks a source's capture as widened, in the widen's own transaction: backfills of
 * transforms reading `added` wait until the transactions holding a writer lock on the
 * source when it commits have ended (recorded by the next `settleWidenWaits`).
 *
 * Why: a widen replaces the UPDATE trigger's function without a lock on the source. A
 * session looks the function up again only once it has processed the catalog change,
 * which it does when its transaction starts or takes a lock it did not hold: a statement
 * of a transaction that held the source's lock before the widen may run the older
 * function, and miss a change to a newly captured column. A backfill that read the row
 * before that transaction committed would never be corrected. Transactions that took the
 * lock after the widen committed, and everything outside this database, run no older
 * code here and are not waited on.
 */
export async function markWidened(
  session: Session,
  schema: string,
  sourceId: number,
  added: string[],
): Promise<void> {
  const s = quoteIdent(schema);
  await session.query(
    `UPDATE ${s}.sources
        SET widened_at = clock_timestamp(), widen_holders = NULL,
            widen_columns = ARRAY(SELECT DISTINCT c FROM unnest(coalesce(widen_columns, '{}') || $2::name[]) c
                                   ORDER BY c)
      WHERE id = $1`,
    [sourceId, added],
  );
}

/**
 * Transactions of this database holding a writer lock on a source or on one of its
 * partitions or inheritance children now (the staging session's own excepted), and
 * whether each is a transaction prepared at or after `since`.
 */
const HOLDERS_SQL = `
  SELECT l.virtualtransaction AS vxid, min(l.pid) AS pid,
         coalesce(bool_or(p.prepared >= $3::text::timestamptz), false) AS prepared_since
    FROM pg_locks l
    LEFT JOIN pg_locks x ON l.pid IS NULL AND x.locktype = 'transactionid' AND x.pid IS NULL
                        AND x.virtualtransaction = l.virtualtransaction
    LEFT JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
   WHERE l.locktype = 'relation' AND l.granted
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.relation IN ${withDescendantsSql('$1')}
     AND l.mode = ANY ($2::text[])
     AND l.pid IS DISTINCT FROM pg_backend_pid()
   GROUP BY l.virtualtransaction`;

/**
 * Moves each open widen wait on (run by the staging worker before it starts backfills):
 * records the transactions to wait on the first time it sees a widen (every one holding a
 * writer lock then has held it since before the widen committed, or took it later and runs
 * the new code: waiting on those too is harmless), drops those that have ended, and ends
 * the wait when none is left. A backfill started after that reads every row as the older
 * code's transactions left it.
 *
 * A recorded transaction that is PREPAREd keeps its virtual transaction id in pg_locks on
 * the servers tested (15, 18); should a server show it under another one, the pass that
 * finds a recorded session's transaction gone also waits on every transaction prepared
 * since the widen that holds a writer lock on the source.
 */
export async function settleWidenWaits(
  session: Session,
  schema: string,
  log: Logger,
): Promise<void> {
  const s = quoteIdent(schema);
  const open = await session.query<{
    id: number;
    oid: string;
    qualified: string;
    since: string;
    holders: WidenHolder[] | null;
  }>(
    `SELECT id, source_oid::text AS oid, qualified, widened_at::text AS since, widen_holders AS holders
       FROM ${s}.sources WHERE widened_at IS NOT NULL`,
  );
  for (const wait of open) {
    const held = await session.query<{ vxid: string; pid: number | null; prepared_since: boolean }>(
      HOLDERS_SQL,
      [wait.oid, WRITER_LOCK_MODES, wait.since],
    );
    const holding = new Set(held.map((h) => h.vxid));
    let next: WidenHolder[];
    if (wait.holders === null) {
      next = held.map((h) => ({ vxid: h.vxid, pid: h.pid }));
    } else {
      next = wait.holders.filter((h) => holding.has(h.vxid));
      if (wait.holders.some((h) => h.pid !== null && !holding.has(h.vxid))) {
        for (const h of held) {
          if (h.prepared_since && !next.some((n) => n.vxid === h.vxid)) {
            next.push({ vxid: h.vxid, pid: null });
          }
        }
      }
    }
    if (next.length === 0) {
      await session.query(
        `UPDATE ${s}.sources SET widened_at = NULL, widen_columns = NULL, widen_holders = NULL
          WHERE id = $1 AND widened_at = $2::text::timestamptz`,
        [wait.id, wait.since],
      );
      log.info({ table: wait.qualified }, 'capture widen settled: no transaction runs older code');
    } else if (
      wait.holders === null ||
      next.map((h) => h.vxid).join(' ') !== wait.holders.map((h) => h.vxid).join(' ')
    ) {
      await session.query(
        `UPDATE ${s}.sources SET widen_holders = $2::text::jsonb WHERE id = $1 AND widened_at = $3::text::timestamptz`,
        [wait.id, JSON.stringify(next), wait.since],
      );
      if (wait.holders === null) {
        log.info(
          { table: wait.qualified, transactions: next.length },
          'capture widened: backfills reading the new columns wait for transactions that may run older code',
        );
      }
    }
  }
}
