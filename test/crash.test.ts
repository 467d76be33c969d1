import type postgres from 'postgres';
import { afterAll, describe, expect, it } from 'vitest';
import { startPostgres } from '../src/testing/index.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import {
  killAllWorkerProcesses,
  killHard,
  startAppProcess,
  startWorkerProcess,
} from './support/processes.js';
import { announceSeed, scaled, testSeeds, timeoutFor } from './support/seeds.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';
import { prng, runWorkload, streamSeed } from './support/workload.js';
import { ACCOUNTS_DDL, accountsWorkload, seedAccounts } from './support/workload-accounts.js';

afterAll(killAllWorkerProcesses);

/** Steps per writer of the restart test's workload: about 12 s of writes. */
const OPERATIONS = 1200;

const DEFINITIONS: Definition[] = [
  { target: 'acct_all', from: 'accounts', select: 'owner, balance', implicit: 'id' },
  {
    target: 'acct_active',
    from: 'accounts',
    select: 'owner, balance * 2 AS doubled',
    where: "status = 'active'",
    implicit: 'id',
  },
];

async function prepare(db: TestDatabase, rows: number): Promise<void> {
  await db.sql.unsafe(ACCOUNTS_DDL);
  await db.sql.unsafe(seedAccounts(rows));
}

async function expectConverged(
  db: TestDatabase,
  trellis: Awaited<ReturnType<typeof migratedTrellis>>,
  definitions: Definition[] = DEFINITIONS,
) {
  const token = await trellis.watermarkToken();
  for (const d of definitions) {
    await trellis.awaitConverged(d.target, token, { timeoutMs: 25_000 });
    await expectMatchesDefinition(db.sql, d);
  }
}

/** I6: a crash at any point loses no change. */
describe('crashes', { timeout: 120_000 }, () => {
  it('loses nothing when a draining process is killed -9 in the middle of a page', async () => {
    const db = await freshDatabase();
    await prepare(db, 20_000);
    const api = await migratedTrellis(db);
    try {
      const doomed = await startWorkerProcess(db.url, {
        drainThreads: 2,
        staging: true,
        applicationName: 'doomed',
      });
      for (const d of DEFINITIONS) await api.apply(transformStatement(d));
      await waitForStatus(api, 'acct_all', 'live', 60_000);
      // A big change: a range of many pages, being drained when the process dies.
      await db.sql`INSERT INTO accounts (id, owner, balance, status)
                   SELECT g, 'bulk', g % 500, 'active' FROM generate_series(100001, 200000) g`;
      await db.sql`UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0`;
      // Killed while it is applying a page (a claim held in an open transaction), not idle.
      await waitFor(
        async () => (await busyWith(db, 'doomed:worker', 'WITH changed%')) > 0,
        'a page being applied',
        30_000,
      );
      await killHard(doomed);
      // Work was left undone: pages of the range the dead process claimed or never got to
      // (or, under WAL capture, whose decoder writes a bulk change in several ledger
      // transactions and so in smaller ranges, ranges it had not applied yet).
      const [left] = await db.sql<{ n: number }[]>`
        SELECT (SELECT count(*) FROM trellis.pages)::int
             + (SELECT count(*) FROM trellis.pipeline
                 WHERE cursor_tick < (SELECT max(seq) FROM trellis.ticks))::int AS n`;
      expect(left!.n).toBeGreaterThan(0);
      // Each of its backends ends when it notices its socket closed, not all at once.
      await waitFor(
        async () => !(await api.hasLiveDrainWorkers()) && !(await api.hasLiveStagingWorker()),
        'the dead drains and staging worker to be gone',
      );
      // Another process takes over what the dead one held.
      await using successor = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      await db.sql`DELETE FROM accounts WHERE id BETWEEN 1 AND 500`;
      await expectConverged(db, successor);
    } finally {
      await api.shutdown();
    }
  });
});

/** Backends of `applicationName` inside a transaction whose statement matches `like`. */
async function busyWith(db: TestDatabase, applicationName: string, like: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_stat_activity
     WHERE application_name = ${applicationName} AND xact_start IS NOT NULL
       AND state IN ('active', 'idle in transaction') AND query LIKE ${like}`;
  return row?.n ?? 0;
}

describe('crashes in the middle of a build or a capture install', { timeout: 120_000 }, () => {
  it('loses nothing when the process building a target is killed -9 while the target has no key', async () => {
    const db = await freshDatabase();
    await prepare(db, 200_000);
    const api = await migratedTrellis(db);
    try {
      const doomed = await startWorkerProcess(db.url, {
        drainThreads: 1,
        staging: true,
        applicationName: 'doomed',
      });
      await api.apply(transformStatement(DEFINITIONS[0]!));
      // A build into an empty target drops its key and indexes until it is done: kill it
      // while a chunk is being filled with the key gone.
      await waitFor(
        async () => {
          const [row] = await db.sql<{ keyless: boolean }[]>`
            SELECT p.deferred_ddl IS NOT NULL AS keyless FROM trellis.pipeline p`;
          const filling = `INSERT INTO %${DEFINITIONS[0]!.target} (%`;
          return row?.keyless === true && (await busyWith(db, 'doomed:worker', filling)) > 0;
        },
        'a chunk being filled into a target without its key',
        60_000,
      );
      await killHard(doomed);
      await using successor = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      await db.sql`UPDATE accounts SET balance = balance + 7 WHERE id % 1000 = 0`;
      await waitForStatus(successor, 'acct_all', 'live', 90_000);
      // Its key back (the oracle checks), and every row.
      await expectConverged(db, successor, [DEFINITIONS[0]!]);
    } finally {
      await api.shutdown();
    }
  });

  it('loses nothing when the staging worker is killed -9 while capture waits to install', async () => {
    const db = await freshDatabase();
    await prepare(db, 1_000);
    const api = await migratedTrellis(db);
    const writer = sqlClient(db.url, { max: 1 });
    try {
      const doomed = await startWorkerProcess(db.url, {
        drainThreads: 1,
        staging: true,
        applicationName: 'doomed',
      });
      // An app transaction holds the table: installing capture has to wait for it.
      await writer`BEGIN`;
      await writer`INSERT INTO accounts (id, owner, balance, status) VALUES (5000001, 'held', 1, 'active')`;
      await api.apply(transformStatement(DEFINITIONS[0]!));
      await waitFor(
        async () => (await api.status('acct_all')).captureWait?.operation === 'install',
        'capture to wait to install',
      );
      await killHard(doomed);
      await writer`COMMIT`;
      await db.sql`UPDATE accounts SET owner = 'after' WHERE id <= 10`;
      await using successor = await migratedTrellis(db, { staging: true, drainThreads: 1 });
      await waitForStatus(successor, 'acct_all', 'live');
      await expectConverged(db, successor, [DEFINITIONS[0]!]);
    } finally {
      await writer.end({ timeout: 2 });
      await api.shutdown();
    }
  });
});

/** I6 with the app's own process under fire, while random writers write through a restart. */
describe.each(testSeeds([9], 5))('crashes under concurrent writes (seed %i)', (seed) => {
  it('an app process survives hundreds of cut connections and a Postgres restart, and catches up', {
    timeout: timeoutFor(120_000, 600_000),
  }, async () => {
    announceSeed('crash', seed, 'test/crash.test.ts');
    // wal_level = logical as the suite's own cluster has it (WAL capture runs: ADR 0023).
    const server = await startPostgres({ settings: { wal_level: 'logical' } });
    let check: postgres.Sql | undefined;
    try {
      const { url, name } = await server.createDatabase();
      const sql = sqlClient(url, { max: 1 });
      await prepare({ name, url, sql }, 10_000);
      await sql.end({ timeout: 2 });
      {
        await using definer = await migratedTrellis({ name, url, sql });
        for (const d of DEFINITIONS) await definer.apply(transformStatement(d));
      }
      const app = await startAppProcess(url, ['acct_all', 'acct_active']);
      // Backends the app process has, or is opening: its sessions are named trellis-pg…,
      // and a backend still starting up has no name yet.
      const cutter = new Cutter(url, name, streamSeed(seed, 1000));
      const firstCuts = cutter.cut(130);
      // Single statements from two writers, a client each, through the cuts and the
      // restart: writers that get halfway before the first cuts are done wait for them, so
      // the restart comes while they still have half their writes to make.
      const operations = scaled(OPERATIONS);
      const writes = runWorkload(sql, accountsWorkload(10_000), {
        newClient: () => sqlClient(url, { max: 1 }),
        seed,
        writers: 2,
        operations,
        survivesRestarts: true,
        holdAt: { step: operations / 2, until: firstCuts },
      });
      // Awaited below; a failure meanwhile is not an unhandled rejection.
      writes.catch(() => undefined);
      await firstCuts;
      await server.restart('immediate');
      await cutter.cut(130);
      await cutter.cutWhileConnecting(30_000);
      await cutter.end();
      const result = await writes;
      console.log(`[workload] crash ${seed} ${JSON.stringify(result)}`);
      // The writers were writing when Postgres restarted, and saw it.
      expect(result.expected.connectionLost).toBeGreaterThan(0);
      expect(result.committed).toBeGreaterThan(100);
      // Real transactions were in flight: some rolled back, some with savepoints rolled back.
      expect(result.rolledBack).toBeGreaterThan(0);
      expect(result.savepointsRolledBack).toBeGreaterThan(0);
      expect(app.alive()).toBe(true);
      expect(cutter.terminated).toBeGreaterThanOrEqual(260);
      expect(cutter.duringConnect).toBeGreaterThan(0);

      // The app recovers by itself: its workers bring every target up to date, and its
      // calls succeed again.
      check = sqlClient(url);
      await using observer = await migratedTrellis({ name, url, sql: check });
      await expectConverged({ name, url, sql: check }, observer);
      const recovered = (await app.stats()).outcomes.ok ?? 0;
      await waitFor(
        async () => ((await app.stats()).outcomes.ok ?? 0) > recovered + 10,
        "the app's calls to succeed again",
      );
      const { code, report } = await app.stop();
      expect(code).toBe(0);
      expect(report!.foreign).toBe(0);
      // Its calls failed only as a lost connection or a deadline would make them fail.
      const codes = Object.keys(report!.outcomes).filter((c) => c !== 'ok');
      expect(codes.filter((c) => c !== 'connection' && c !== 'timeout')).toEqual([]);
    } finally {
      await check?.end({ timeout: 2 });
      await server.stop();
    }
  });
});

/**
 * Terminates the app process's backends at random moments, hundreds of them: one to three at a
 * time, and every other time the newest one right after, to catch connections while they
 * start up. Counts what it terminated, and how many of those were still connecting.
 */
class Cutter {
  terminated = 0;
  duringConnect = 0;
  private sql: postgres.Sql;
  private readonly random: () => number;

  constructor(
    private readonly url: string,
    private readonly database: string,
    seed: number,
  ) {
    this.sql = sqlClient(url, { max: 1 });
    this.random = prng(seed);
  }

  /** Cuts until `wanted` more backends were terminated (gives up after 20 tries each). */
  async cut(wanted: number): Promise<void> {
    const goal = this.terminated + wanted;
    for (let i = 0; this.terminated < goal && i < wanted * 20; ) {
      try {
        const newest = i % 2 === 1;
        const [row] = await this.sql<{ n: number; connecting: number }[]>`
          SELECT count(*) FILTER (WHERE t.ok)::int AS n,
                 count(*) FILTER (WHERE t.ok AND t.connecting)::int AS connecting
            FROM (SELECT pg_terminate_backend(a.pid) AS ok,
                         (a.state IS NULL OR a.application_name = '') AS connecting
                    FROM pg_stat_activity a
                   WHERE a.datname = ${this.database} AND a.pid <> pg_backend_pid()
                     AND a.backend_type = 'client backend'
                     AND (a.application_name LIKE 'trellis-pg%' OR a.application_name = '')
                   ORDER BY CASE WHEN ${newest} THEN a.backend_start END DESC NULLS LAST, random()
                   LIMIT ${newest ? 1 : 1 + Math.floor(this.random() * 3)}) t`;
        this.terminated += row!.n;
        this.duringConnect += row!.connecting;
        i += 1;
      } catch {
        // The server restarted under this client: take a new one.
        void this.sql.end({ timeout: 0 });
        this.sql = sqlClient(this.url, { max: 1 });
        // A back-off before reconnecting to a restarting server (not a wait for an event).
        await new Promise((resolve) => setTimeout(resolve, 100)); // back-off before reconnecting
        continue;
      }
      // Pacing: the disruptions spread over the run at random, not a wait for anything.
      await new Promise((resolve) => setTimeout(resolve, Math.floor(this.random() * 60))); // pacing of the disruptions
    }
  }

  /**
   * Cuts backends of the app's that are still connecting, watching for them without
   * pacing, until one was cut (or `ms` passed): the random cuts above catch one only now and
   * then on a fast, idle machine, where a connection starts up in a millisecond.
   */
  async cutWhileConnecting(ms: number): Promise<void> {
    const had = this.duringConnect;
    const until = Date.now() + ms;
    while (this.duringConnect === had && Date.now() < until) {
      const [row] = await this.sql<{ n: number }[]>`
        SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid))::int AS n
          FROM pg_stat_activity a
         WHERE a.datname = ${this.database} AND a.pid <> pg_backend_pid()
           AND a.backend_type = 'client backend'
           AND (a.state IS NULL OR a.application_name = '')`;
      this.terminated += row!.n;
      this.duringConnect += row!.n;
    }
  }

  end(): Promise<void> {
    return this.sql.end({ timeout: 2 });
  }
}
