// Small builds filled in one statement (ADR 0060): up to ONE_STATEMENT_ROWS driving rows a
// build is filled, given its key back and moved on in the one transaction that starts it;
// the setting trellis.one_statement_build_rows changes the limit (0: always chunks).
import { afterAll, describe, expect, it } from 'vitest';
import type { Logger } from '../src/engine/index.js';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { killAllWorkerProcesses, killHard, startWorkerProcess } from './support/processes.js';
import { quietLogger } from './support/recent-logs.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';
import { ACCOUNTS_DDL, seedAccounts } from './support/workload-accounts.js';

const ROWS = 60_000;

const PROJECTION: Definition = {
  target: 'acct_owners',
  from: 'accounts',
  select: 'owner, balance * 2 AS doubled',
  where: "status = 'active'",
  implicit: 'id',
};

/** A logger keeping the messages of the build's debug lines. */
function buildLines(lines: string[]): Logger {
  return {
    ...quietLogger,
    debug(_obj: Record<string, unknown>, msg: string) {
      if (msg === 'a build filled in one statement' || msg === 'a build chunk filled') {
        lines.push(msg);
      }
    },
  };
}

afterAll(killAllWorkerProcesses);

describe('builds filled in one statement', { timeout: 120_000 }, () => {
  it('fills a small build in one statement, with writes during the build applied, and progress complete', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(ROWS));
    const lines: string[] = [];
    await using trellis = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      logger: buildLines(lines),
    });
    await trellis.apply(transformStatement(PROJECTION));
    // Writes while the build starts reach the target through the ledger.
    await db.sql`UPDATE accounts SET balance = balance + 3 WHERE id % 97 = 0`;
    await db.sql`UPDATE accounts SET status = 'closed' WHERE id % 101 = 0`;
    await db.sql`DELETE FROM accounts WHERE id % 103 = 0`;
    await db.sql`INSERT INTO accounts (id, owner, balance, status, branch_id)
                 SELECT g, 'late ' || g, g, 'active', 1 FROM generate_series(${ROWS + 1}::int, ${ROWS + 50}::int) g`;
    await waitForStatus(trellis, PROJECTION.target, 'live', 90_000);
    expect(lines).toContain('a build filled in one statement');
    expect(lines).not.toContain('a build chunk filled');
    const status = await trellis.status(PROJECTION.target);
    // Never analysed: the driving rows were counted (when the build started, the writes
    // above maybe among them), and the progress ends at them.
    expect(status.backfill?.keysTotal).toBeGreaterThan(ROWS - 1_000);
    expect(status.backfill?.keysDone).toBe(status.backfill?.keysTotal);
    await trellis.awaitConverged(PROJECTION.target, await trellis.watermarkToken(), {
      timeoutMs: 30_000,
    });
    // Its key back (the oracle checks it), and every row once.
    await expectMatchesDefinition(db.sql, PROJECTION);
  });

  it('fills by chunks when trellis.one_statement_build_rows is 0, and the target equals its definition', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(ROWS));
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET trellis.one_statement_build_rows = 0`);
    const lines: string[] = [];
    await using trellis = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      logger: buildLines(lines),
    });
    await trellis.apply(transformStatement(PROJECTION));
    await db.sql`UPDATE accounts SET balance = balance + 5 WHERE id % 89 = 0`;
    await waitForStatus(trellis, PROJECTION.target, 'live', 90_000);
    expect(lines).toContain('a build chunk filled');
    expect(lines).not.toContain('a build filled in one statement');
    await trellis.awaitConverged(PROJECTION.target, await trellis.watermarkToken(), {
      timeoutMs: 30_000,
    });
    await expectMatchesDefinition(db.sql, PROJECTION);
  });

  it('starts a one-statement build over when the process filling it is killed -9', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    // At the limit: the longest fill in one statement.
    await db.sql.unsafe(seedAccounts(100_000));
    const api = await migratedTrellis(db);
    try {
      const doomed = await startWorkerProcess(db.url, {
        drainThreads: 1,
        staging: true,
        applicationName: 'doomed',
      });
      await api.apply(transformStatement(PROJECTION));
      await waitFor(
        async () => {
          const [row] = await db.sql<{ n: number }[]>`
            SELECT count(*)::int AS n FROM pg_stat_activity
             WHERE application_name = 'doomed:worker' AND state = 'active'
               AND query LIKE ${`INSERT INTO %${PROJECTION.target} (%`}`;
          return (row?.n ?? 0) > 0;
        },
        'the build being filled by the doomed process',
        60_000,
      );
      await killHard(doomed);
      // Nothing of it committed: no row, the key still there, the build not done.
      expect((await api.status(PROJECTION.target)).status).toBe('backfilling');
      const [rows] = await db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM acct_owners`;
      expect(rows?.n).toBe(0);
      await using successor = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      await db.sql`UPDATE accounts SET balance = balance + 7 WHERE id % 1000 = 0`;
      await waitForStatus(successor, PROJECTION.target, 'live', 90_000);
      await successor.awaitConverged(PROJECTION.target, await successor.watermarkToken(), {
        timeoutMs: 30_000,
      });
      // Its key back (the oracle checks it), and every row once.
      await expectMatchesDefinition(db.sql, PROJECTION);
    } finally {
      await api.shutdown();
    }
  });
});
