import postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { startPostgres } from '../src/testing/index.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { differences } from './support/oracle.js';
import { killAllWorkerProcesses, killHard, startWorkerProcess } from './support/processes.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';
import { ACCOUNTS_DDL, runWorkload, seedAccounts } from './support/workload.js';

afterAll(killAllWorkerProcesses);

const DEFINITIONS = [
  'TRANSFORM acct_all FROM accounts SELECT owner, balance',
  "TRANSFORM acct_active FROM accounts SELECT owner, balance * 2 AS doubled WHERE status = 'active'",
];

async function prepare(db: TestDatabase, rows: number): Promise<void> {
  await db.sql.unsafe(ACCOUNTS_DDL);
  await db.sql.unsafe(seedAccounts(rows));
}

async function expectConverged(
  db: TestDatabase,
  trellis: Awaited<ReturnType<typeof migratedTrellis>>,
) {
  const token = await trellis.watermarkToken();
  for (const target of ['acct_all', 'acct_active']) {
    await trellis.awaitConverged(target, token, { timeoutMs: 25_000 });
    expect({ target, ...(await differences(db.sql, target)) }).toEqual({
      target,
      missing: [],
      extra: [],
    });
  }
}

/** I6: a crash at any point loses no change. */
describe('crashes', { timeout: 120_000 }, () => {
  it('loses nothing when a draining process is killed -9 in the middle of a page', async () => {
    const db = await freshDatabase();
    await prepare(db, 20_000);
    const api = await migratedTrellis(db);
    try {
      const doomed = await startWorkerProcess(db.url, { drainThreads: 2, staging: true });
      for (const d of DEFINITIONS) await api.apply(d);
      await waitForStatus(api, 'acct_all', 'live');
      // A big change: a range of many pages, being drained when the process dies.
      await db.sql`INSERT INTO accounts (id, owner, balance, status)
                   SELECT g, 'bulk', g % 500, 'active' FROM generate_series(100001, 200000) g`;
      await db.sql`UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0`;
      await waitFor(
        async () => (await db.sql`SELECT count(*)::int AS n FROM trellis.pages`)[0]!.n > 1,
        'pages to open',
      );
      await killHard(doomed);
      await waitFor(async () => !(await api.hasLiveDrainWorkers()), 'the dead drains to be gone');
      expect(await api.hasLiveStagingWorker()).toBe(false);
      // Another process takes over what the dead one held.
      await using successor = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      await db.sql`DELETE FROM accounts WHERE id BETWEEN 1 AND 500`;
      await expectConverged(db, successor);
    } finally {
      await api.shutdown();
    }
  });

  it('loses nothing when the workers’ connections are cut again and again', async () => {
    const db = await freshDatabase();
    await prepare(db, 10_000);
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    for (const d of DEFINITIONS) await trellis.apply(d);
    // A worker's first connection fetches the server's types, and postgres.js 3.4.9 turns
    // a cut mid-fetch into an unhandled rejection (ADR 0007). Later connections copy the
    // types, so the cuts start once the workers are up.
    await waitFor(
      async () => (await trellis.hasLiveStagingWorker()) && (await trellis.hasLiveDrainWorkers()),
      'the workers to connect',
    );
    let cutting = true;
    const cuts = (async () => {
      let n = 0;
      while (cutting) {
        await db.sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE datname = current_database() AND application_name = 'trellis-pg:worker'`;
        n += 1;
        await new Promise((resolve) => setTimeout(resolve, 300));
      }
      return n;
    })();
    await runWorkload(db.sql, { seed: 7, clients: 3, durationMs: 3_000, initialRows: 10_000 });
    cutting = false;
    expect(await cuts).toBeGreaterThan(5);
    await expectConverged(db, trellis);
  });

  it('loses nothing across a Postgres crash and restart mid-run', async () => {
    const server = await startPostgres();
    try {
      const { url, name } = await server.createDatabase();
      // Test-side clients do not outlive the restart: postgres.js 3.4.9 can throw from a
      // timer when a connection it pooled dies (porsager/postgres#1208). The engine's own
      // clients are retired when their connection closes, which is what this tests.
      const before = postgres(url, { max: 1, onnotice: () => undefined });
      await prepare({ name, url, sql: before }, 10_000);
      await before.end({ timeout: 2 });
      await using trellis = await migratedTrellis(
        { name, url, sql: before },
        { staging: true, drainThreads: 2 },
      );
      for (const d of DEFINITIONS) await trellis.apply(d);
      const writes = runWorkload(before, {
        newClient: () => postgres(url, { max: 1, onnotice: () => undefined }),
        seed: 5,
        clients: 3,
        durationMs: 4_000,
        initialRows: 10_000,
        survivesRestarts: true,
      });
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      await server.restart('immediate');
      await writes;
      await waitFor(
        async () => trellis.hasLiveStagingWorker().catch(() => false),
        'the staging worker to return',
      );
      const sql = sqlClient(url);
      try {
        await expectConverged({ name, url, sql }, trellis);
      } finally {
        await sql.end({ timeout: 2 });
      }
    } finally {
      await server.stop();
    }
  });
});
