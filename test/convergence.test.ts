import { afterAll, describe, expect, it } from 'vitest';
import { freshDatabase } from './support/database.js';
import {
  type Definition,
  expectMatchesDefinition,
  linkChains,
  transformStatement,
} from './support/oracle.js';
import {
  killAllWorkerProcesses,
  startWorkerProcess,
  stopWorkerProcess,
} from './support/processes.js';
import { announceSeed, scaled, testSeeds, timeoutFor } from './support/seeds.js';
import { awaitConvergedWithin, migratedTrellis } from './support/trellis.js';
import { collectPrintedEvents, type WorkEvent } from './support/work-events.js';
import { runWorkload } from './support/workload.js';
import { ACCOUNTS_DDL, accountsWorkload, seedAccounts } from './support/workload-accounts.js';

afterAll(killAllWorkerProcesses);

/**
 * A projection, a filter, a chain over the filter, a GROUP BY with HAVING (groups come and
 * go), and a join of two tables that both change.
 */
// Chains (a FROM naming another's target) are recomputed from the base tables.
const DEFINITIONS: Definition[] = linkChains([
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
  {
    target: 'acct_by_owner',
    from: 'accounts',
    select: 'owner, count(*) AS n, sum(balance) AS total, min(branch_id) AS first_branch',
    where: "status <> 'frozen'",
    groupBy: 'owner',
    having: 'count(*) > 1',
  },
  {
    target: 'acct_branch',
    from: 'accounts a JOIN branches b ON b.id = a.branch_id',
    select: 'a.owner, a.balance, b.city',
    where: "a.status = 'active'",
    // Both keys: accounts' id, and branches' id under its alias (id is taken).
    implicit: 'a.id AS id, b.id AS b_id',
  },
]);

/**
 * I4 under load: random concurrent writes while targets backfill and afterwards, drained
 * by loops in two processes; after awaitConverged each target equals its definition run
 * by Postgres as a plain SELECT.
 */
describe.each(testSeeds([11, 22, 33]))('convergence under concurrent writes (seed %i)', (seed) => {
  it('leaves every target equal to its definition', { timeout: timeoutFor(60_000) }, async () => {
    announceSeed('convergence', seed, 'test/convergence.test.ts');
    const db = await freshDatabase();
    // The second process shares the builds' chunks: a build this small is otherwise filled in
    // one statement by whichever loop claims it (ADR 0060), leaving it nothing to prove it worked.
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET trellis.one_statement_build_rows = 0`);
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(30_000));
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    // The second process must really share the work: the drain's records of its work
    // (a range or page applied, a build chunk filled) that it prints, not a sample of its sessions.
    const otherWork: WorkEvent[] = [];
    const other = await startWorkerProcess(
      db.url,
      {
        drainThreads: 2,
        staging: false,
        applicationName: 'second-process',
      },
      collectPrintedEvents(otherWork, 'second-process'),
    );
    try {
      for (const d of DEFINITIONS) await trellis.apply(transformStatement(d));
      // Writes start while the targets are still backfilling.
      const truncates = seed % 3 === 0 ? 1 : 0;
      const result = await runWorkload(db.sql, accountsWorkload(30_000), {
        seed,
        writers: 4,
        operations: scaled(150),
        truncates,
        longTransactions: scaled(2),
      });
      console.log(`[workload] convergence ${seed} ${JSON.stringify(result)}`);
      expect(result.committed).toBeGreaterThan(50);
      expect(result.truncates).toBe(truncates);
      expect(result.longTransactions).toBe(scaled(2));
      expect(result.savepointsRolledBack).toBeGreaterThan(0);
      expect(result.rolledBack).toBeGreaterThan(0);
      // Key changes onto keys that exist fail, as they must.
      expect(result.expected.uniqueViolation).toBeGreaterThan(0);
      const token = await trellis.watermarkToken();
      for (const d of DEFINITIONS)
        await awaitConvergedWithin(trellis, d.target, token, timeoutFor(25_000, 180_000));
      for (const d of DEFINITIONS) await expectMatchesDefinition(db.sql, d);
      for (const d of DEFINITIONS) expect((await trellis.status(d.target)).heldKeys).toBe(0);
      expect(otherWork.length).toBeGreaterThan(0);
      expect(other.exitCode).toBeNull();
    } finally {
      await stopWorkerProcess(other);
    }
  });
});
