import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import { LEDGER_PAGES_PER_RANGE } from '../internal/ledger.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';

interface Partition {
  index: number;
  blocks: string;
}

/**
 * Keeps the ledger's BRIN index summarised up to the page ranges writers have left.
 *
 * Every range query (the ticker's, the drain's) finds its rows through that index, but a
 * page range not yet summarised matches every query, and autovacuum (autosummarize) gets
 * to new ranges only on its next round, a minute later by default: after a burst of
 * writes, every query would read the whole burst until then. The range writers are still
 * filling is left alone on purpose: once summarised, every insert into it would have to
 * update its summary (about 8% of 8-client INSERT throughput, measured), while left
 * unsummarised it costs a query at most a few dozen pages.
 */
export class LedgerSummaries {
  /** Per BRIN index (one per ledger partition): the first block not yet summarised. */
  private readonly next = new Map<number, number>();

  constructor(
    private readonly schema: string,
    private readonly log: Logger,
  ) {}

  /** Called after each tick. A lock it cannot get at once, or a missing privilege, skips it. */
  async summarize(session: Session): Promise<void> {
    try {
      const partitions = await session.query<Partition>(
        `SELECT i.indexrelid::int AS index,
                pg_relation_size(h.inhrelid) / current_setting('block_size')::int AS blocks
           FROM pg_inherits h
           JOIN pg_index i ON i.indrelid = h.inhrelid
           JOIN pg_class c ON c.oid = i.indexrelid
           JOIN pg_am am ON am.oid = c.relam AND am.amname = 'brin'
          WHERE h.inhparent = $1::regclass`,
        [`${quoteIdent(this.schema)}.ledger`],
      );
      for (const p of partitions) await this.summarizePartition(session, p);
    } catch (error) {
      this.log.debug({ sqlstate: sqlstateOf(error) }, 'ledger index summary skipped');
    }
  }

  private async summarizePartition(session: Session, p: Partition): Promise<void> {
    const blocks = Number(p.blocks);
    let from = this.next.get(p.index) ?? 0;
    // TRUNCATEd since: start over.
    if (blocks < from) from = 0;
    // Ranges that end a whole range before the last block: writers have moved on.
    const completeEnd =
      Math.floor(Math.max(0, blocks - LEDGER_PAGES_PER_RANGE) / LEDGER_PAGES_PER_RANGE) *
      LEDGER_PAGES_PER_RANGE;
    if (completeEnd <= from) {
      this.next.set(p.index, from);
      return;
    }
    await session.transaction(async () => {
      await session.query("SET LOCAL lock_timeout = '20ms'");
      await session.query(
        `SELECT brin_summarize_range($1::oid::regclass, b)
           FROM generate_series($2::bigint, $3::bigint - 1, $4::bigint) b`,
        [p.index, from, completeEnd, LEDGER_PAGES_PER_RANGE],
      );
    });
    this.next.set(p.index, completeEnd);
  }
}
