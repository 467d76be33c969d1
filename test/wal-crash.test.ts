import { afterAll, describe, expect, it } from 'vitest';
import { waitUntilOnTheSlot } from './support/capture-mode.js';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import {
  killAllWorkerProcesses,
  killHard,
  startWorkerProcess,
  stopWorkerProcess,
} from './support/processes.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

afterAll(killAllWorkerProcesses);

// I6 for WAL capture (ADR 0023): the process consuming the slot is killed -9 while it is
// writing a big transaction's keys into the ledger, batch by batch, before it could
// acknowledge that transaction. The standby's decoder takes the slot over and replays from
// the last acknowledged position: nothing is lost, and keys written twice are harmless.

const D: Definition[] = [
  { target: 'bulk_values', from: 'bulk', select: 'v', implicit: 'id' },
  {
    target: 'bulk_groups',
    from: 'bulk',
    select: 'g, count(*) AS n, sum(v) AS total',
    groupBy: 'g',
  },
];

describe('WAL capture crashes', () => {
  it('loses nothing when the process consuming the slot is killed -9 mid-batch', {
    timeout: 480_000,
  }, async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE bulk (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL);
      CREATE INDEX ON bulk (g);
      INSERT INTO bulk SELECT i, i % 50, i FROM generate_series(1, 1000) i;`);
    // This handle drains; the staging worker and the decoder run in child processes.
    await using trellis = await migratedTrellis(db, { drainThreads: 2, capture: 'logical' });
    const doomed = await startWorkerProcess(db.url, {
      drainThreads: 0,
      staging: true,
      applicationName: 'doomed',
    });
    let standby: Awaited<ReturnType<typeof startWorkerProcess>> | undefined;
    try {
      for (const d of D) await trellis.apply(transformStatement(d));
      for (const d of D) await waitForStatus(trellis, d.target, 'live', 60_000);
      // Live is not yet on the slot: the slot is made (waiting for every transaction in
      // the cluster), then the source moves off its triggers. The crash must meet the
      // slot, not the triggers.
      await waitUntilOnTheSlot(db.sql);
      const [source] = await db.sql<{ id: number }[]>`
        SELECT id FROM trellis.sources WHERE qualified = 'public.bulk'`;
      const rowsOf = async () =>
        Number(
          (
            await db.sql<{ n: string }[]>`
              SELECT count(*) AS n FROM trellis.ledger WHERE source_id = ${source!.id}`
          )[0]!.n,
        );
      const before = await rowsOf();
      // One transaction of 300,000 changed keys: the decoder writes it in batches of
      // 5,000 and may acknowledge it only after its last one.
      await db.sql`INSERT INTO bulk SELECT i, i % 50, i FROM generate_series(1001, 301000) i`;
      const [end] = await db.sql<
        { lsn: string }[]
      >`SELECT pg_current_wal_insert_lsn()::text AS lsn`;
      // Small writes after it, which the killed decoder never acknowledges either.
      await db.sql`UPDATE bulk SET v = -v WHERE id <= 100`;
      await db.sql`DELETE FROM bulk WHERE id BETWEEN 200 AND 250`;
      let midBatch = false;
      await waitFor(
        async () => {
          const [slot] = await db.sql<{ acked: boolean }[]>`
            SELECT confirmed_flush_lsn >= ${end!.lsn}::pg_lsn AS acked
              FROM pg_replication_slots WHERE database = current_database()`;
          if (slot?.acked) return true; // too late: asserted below
          if ((await rowsOf()) >= before + 2) {
            midBatch = true;
            return true;
          }
          return false;
        },
        'the decoder to write part of the big transaction',
        // Decoding starts at the commit and spills the transaction to disk first: minutes
        // when another test file loads the disk (seconds alone).
        240_000,
      );
      await killHard(doomed);
      // Killed with batches of the transaction in the ledger and the transaction not
      // acknowledged: the slot replays it whole.
      expect(midBatch).toBe(true);
      const [killed] = await db.sql<{ acked: boolean }[]>`
        SELECT confirmed_flush_lsn >= ${end!.lsn}::pg_lsn AS acked
          FROM pg_replication_slots WHERE database = current_database()`;
      expect(killed?.acked).toBe(false);
      standby = await startWorkerProcess(db.url, {
        drainThreads: 0,
        staging: true,
        applicationName: 'standby',
      });
      const token = await trellis.watermarkToken();
      for (const d of D) await trellis.awaitConverged(d.target, token, { timeoutMs: 180_000 });
      for (const d of D) await expectMatchesDefinition(db.sql, d);
      // The standby's decoder streamed the slot and acknowledged past the transaction.
      const [slot] = await db.sql<{ acked: boolean }[]>`
        SELECT confirmed_flush_lsn >= ${end!.lsn}::pg_lsn AS acked
          FROM pg_replication_slots WHERE database = current_database()`;
      expect(slot?.acked).toBe(true);
    } finally {
      await killHard(doomed);
      if (standby) await stopWorkerProcess(standby);
    }
  });
});
