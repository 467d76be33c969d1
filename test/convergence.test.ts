import { afterAll, describe, expect, it } from 'vitest';
import { differences } from './support/catalog-oracle.js';
import { freshDatabase } from './support/database.js';
import {
  killAllWorkerProcesses,
  startWorkerProcess,
  stopWorkerProcess,
} from './support/processes.js';
import { migratedTrellis } from './support/trellis.js';
import { ACCOUNTS_DDL, runWorkload, seedAccounts } from './support/workload.js';

afterAll(killAllWorkerProcesses);

const TARGETS = ['acct_all', 'acct_active', 'acct_rich'];

/**
 * I4 under load: random concurrent writes while targets backfill and afterwards, drained
 * by loops in two processes; after awaitConverged each target equals its definition
 * recomputed from the sources — a projection, a filter, and a chain over the filter.
 */
describe.each([11, 22, 33])('convergence under concurrent writes (seed %i)', (seed) => {
  it('leaves every target equal to its recompute', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(30_000));
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    const other = await startWorkerProcess(db.url, { drainThreads: 2, staging: false });
    try {
      await trellis.apply('TRANSFORM acct_all FROM accounts SELECT owner, balance');
      await trellis.apply(
        "TRANSFORM acct_active FROM accounts a SELECT a.owner, a.balance * 2 AS doubled WHERE a.status = 'active' AND a.balance > 10",
      );
      await trellis.apply(
        'TRANSFORM acct_rich FROM acct_active SELECT upper(owner) AS owner, doubled WHERE doubled > 900',
      );
      // Writes start while the targets are still backfilling.
      const committed = await runWorkload(db.sql, {
        seed,
        clients: 4,
        durationMs: 3_000,
        initialRows: 30_000,
        truncate: seed === 33,
      });
      expect(committed).toBeGreaterThan(50);
      const token = await trellis.watermarkToken();
      for (const target of TARGETS)
        await trellis.awaitConverged(target, token, { timeoutMs: 25_000 });
      for (const target of TARGETS) {
        expect({ target, ...(await differences(db.sql, target)) }).toEqual({
          target,
          missing: [],
          extra: [],
        });
      }
      for (const target of TARGETS) expect((await trellis.status(target)).heldKeys).toBe(0);
    } finally {
      await stopWorkerProcess(other);
    }
  });
});
