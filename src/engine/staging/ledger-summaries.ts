import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';

/**
 * Brings the ledger's BRIN index up to date with the rows appended since the last call.
 *
 * Every range query (the ticker's, the drain's) finds its rows through that index, but
 * page ranges filled since the last summary match every query until summarised, and
 * autovacuum (autosummarize) gets to them only on its next round, a minute later by
 * default. After a burst of writes, the whole burst would be read by every query until
 * then. Summarising new ranges is cheap when done often: only pages not yet summarised
 * are read. Called after each tick; a lock it cannot get at once (a VACUUM of the
 * ledger) or a missing privilege skips the call, and autovacuum remains the fallback.
 */
export async function summarizeLedger(
  session: Session,
  schema: string,
  log: Logger,
): Promise<void> {
  try {
    await session.transaction(async () => {
      await session.query("SET LOCAL lock_timeout = '20ms'");
      await session.query(
        `SELECT brin_summarize_new_values(i.indexrelid)
           FROM pg_inherits h
           JOIN pg_index i ON i.indrelid = h.inhrelid
           JOIN pg_class c ON c.oid = i.indexrelid
           JOIN pg_am am ON am.oid = c.relam AND am.amname = 'brin'
          WHERE h.inhparent = $1::regclass`,
        [`${quoteIdent(schema)}.ledger`],
      );
    });
  } catch (error) {
    log.debug({ sqlstate: sqlstateOf(error) }, 'ledger index summary skipped');
  }
}
