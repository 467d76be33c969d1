import { afterAll, describe, expect, it } from 'vitest';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import {
  killAllWorkerProcesses,
  startWorkerProcess,
  stopWorkerProcess,
} from './support/processes.js';
import { migratedTrellis } from './support/trellis.js';
import { ACCOUNTS_DDL, runWorkload, seedAccounts } from './support/workload.js';

afterAll(killAllWorkerProcesses);

/** A projection, a filter, and a chain over the filter. */
const DEFINITIONS: Definition[] = [
  { target: 'acct_all', from: 'accounts', select: 'owner, balance', implicit: 'id' },
  {
    target: 'acct_active',
    from: 'accounts a',
    select: 'a.owner, a.balance * 2 AS doubled',
    where: "a.status = 'active' AND a.balance > 10",
    implicit: 'a.id AS id',
  },
  {
    target: 'acct_rich',
    from: 'acct_active',
    select: 'upper(owner) AS owner, doubled',
    where: 'doubled > 900',
    implicit: 'id',
  },
];

/**
 * I4 under load: random concurrent writes while targets backfill and afterwards, drained
 * by loops in two processes; after awaitConverged each target equals its definition
 * run by Postgres as a plain SELECT.
 */
describe.each([11, 22, 33])('convergence under concurrent writes (seed %i)', (seed) => {
  it('leaves every target equal to its definition', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(30_000));
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    const other = await startWorkerProcess(db.url, { drainThreads: 2, staging: false });
    try {
      for (const d of DEFINITIONS) await trellis.apply(transformStatement(d));
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
      for (const d of DEFINITIONS)
        await trellis.awaitConverged(d.target, token, { timeoutMs: 25_000 });
      for (const d of DEFINITIONS) await expectMatchesDefinition(db.sql, d);
      for (const d of DEFINITIONS) expect((await trellis.status(d.target)).heldKeys).toBe(0);
    } finally {
      await stopWorkerProcess(other);
    }
  });
});
