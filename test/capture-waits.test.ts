import type postgres from 'postgres';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Status, Trellis } from '../src/engine/index.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// What capture waits on, and that status() names it (issue #8, "never silently wrong"):
// while capture is installed, every session or prepared transaction holding a lock that
// conflicts with it, on the source or on one of its partitions.

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A session of its own (a client with one connection), named `name` in pg_stat_activity.
 * Its statements are prepared and reused by text, as an app's driver would.
 */
async function openSession(url: string, name: string) {
  const sql = sqlClient(url, { max: 1, connection: { application_name: name } });
  const [row] = await sql`SELECT pg_backend_pid() AS pid`;
  return { sql, pid: row!.pid as number, close: () => sql.end({ timeout: 2 }) };
}

/** Whether the server allows PREPARE TRANSACTION (max_prepared_transactions > 0). */
async function twoPhaseCommit(sql: postgres.Sql): Promise<boolean> {
  const [row] = await sql`SELECT current_setting('max_prepared_transactions')::int AS n`;
  return (row!.n as number) > 0;
}

const NO_TWO_PHASE =
  'the server has max_prepared_transactions = 0 (a TRELLIS_TEST_DATABASE_URL server not ' +
  'started by the suite?): PREPARE TRANSACTION is refused, so prepared blockers cannot be tested';

/** The source columns capture of `table` compares in an UPDATE. */
async function capturedColumns(sql: postgres.Sql, table: string): Promise<string[]> {
  const [row] = await sql`
    SELECT captured_columns::text[] AS columns FROM trellis.sources WHERE qualified = ${table}`;
  return (row?.columns as string[] | undefined) ?? [];
}

describe('what capture waits on', () => {
  let db: TestDatabase;
  let api: Trellis;
  let worker: Trellis;
  let twoPhase = false;

  beforeAll(async () => {
    db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE readings (id int, site text, v int NOT NULL, PRIMARY KEY (id, site))
        PARTITION BY LIST (site);
      CREATE TABLE readings_a PARTITION OF readings FOR VALUES IN ('a');
      CREATE TABLE readings_b PARTITION OF readings FOR VALUES IN ('b');
      INSERT INTO readings SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g FROM generate_series(1, 100) g;
      CREATE TABLE crates (id int PRIMARY KEY, weight int NOT NULL);
      INSERT INTO crates SELECT g, g * 2 FROM generate_series(1, 100) g;
    `);
    twoPhase = await twoPhaseCommit(db.sql);
    api = await migratedTrellis(db);
    worker = await migratedTrellis(db, { staging: true, drainThreads: 2 });
  });

  // A prepared transaction a failed test leaves behind would block DROP DATABASE.
  afterEach(async () => {
    const left = await db.sql<{ gid: string }[]>`
      SELECT gid FROM pg_prepared_xacts WHERE database = current_database()`;
    for (const { gid } of left) await db.sql.unsafe(`ROLLBACK PREPARED '${gid}'`);
  });

  afterAll(async () => {
    await worker?.shutdown();
    await api?.shutdown();
  });

  it('a prepared transaction that wrote a source blocks capture install, and status names it by gid', async (ctx) => {
    if (!twoPhase) ctx.skip(NO_TWO_PHASE);
    const weights: Definition = {
      target: 'crate_weights',
      from: 'crates',
      select: 'weight',
      implicit: 'id',
    };
    const writer = await openSession(db.url, 'crate-writer');
    try {
      await writer.sql`BEGIN`;
      await writer.sql`INSERT INTO crates VALUES (1001, 7)`;
      await writer.sql`UPDATE crates SET weight = 0 WHERE id = 1`;
      await writer.sql`PREPARE TRANSACTION 'trellis_test_crates'`;
    } finally {
      await writer.close();
    }
    const [{ owner }] = (await db.sql`SELECT current_user AS owner`) as [{ owner: string }];

    await api.apply(transformStatement(weights));
    let waiting: Status | undefined;
    await waitFor(async () => {
      waiting = await api.status('crate_weights');
      return (waiting.captureWait?.prepared.length ?? 0) > 0;
    }, 'status to name the prepared transaction');
    expect(waiting).toMatchObject({
      status: 'waiting_to_backfill',
      captureWait: {
        operation: 'install',
        table: 'public.crates',
        lockMode: 'SHARE ROW EXCLUSIVE',
        blockers: [],
      },
    });
    const [prepared] = waiting!.captureWait!.prepared;
    expect(prepared).toEqual({
      gid: 'trellis_test_crates',
      owner,
      database: db.name,
      prepared: expect.any(Date),
      transaction: expect.stringMatching(/^\d+$/),
    });
    expect(Date.now() - prepared!.prepared.getTime()).toBeLessThan(60_000);
    await sleep(500);
    expect(await capturedColumns(db.sql, 'public.crates')).toEqual([]);

    await db.sql`COMMIT PREPARED 'trellis_test_crates'`;
    const live = await waitForStatus(api, 'crate_weights', 'live');
    expect(live.captureWait).toBeNull();
    await db.sql`UPDATE crates SET weight = weight + 1 WHERE id % 9 = 0`;
    const token = await api.watermarkToken();
    await api.awaitConverged('crate_weights', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, weights);
    const rows =
      await db.sql`SELECT id, weight FROM crate_weights WHERE id IN (1, 1001) ORDER BY id`;
    expect(rows.map((r) => [r.id, r.weight])).toEqual([
      [1, 0],
      [1001, 7],
    ]);
  });

  it('an install waits for a session writing straight to a partition, and names it with its database and age', async () => {
    const values: Definition = {
      target: 'reading_values',
      from: 'readings',
      select: 'v',
      implicit: 'id, site',
    };
    const writer = await openSession(db.url, 'partition-writer');
    try {
      await writer.sql`BEGIN`;
      await writer.sql`INSERT INTO readings_a VALUES (1000, 'a', 1)`;
      const [{ started }] = (await writer.sql`SELECT now() AS started`) as [{ started: Date }];

      await api.apply(transformStatement(values));
      let waiting: Status | undefined;
      await waitFor(async () => {
        waiting = await api.status('reading_values');
        return (waiting.captureWait?.blockers.length ?? 0) > 0;
      }, 'status to name the session holding a partition');
      expect(waiting).toMatchObject({
        status: 'waiting_to_backfill',
        captureWait: {
          operation: 'install',
          table: 'public.readings',
          lockMode: 'SHARE ROW EXCLUSIVE',
          prepared: [],
        },
      });
      expect(waiting!.captureWait!.blockers).toEqual([
        {
          pid: writer.pid,
          applicationName: 'partition-writer',
          database: db.name,
          state: 'idle in transaction',
          xactStart: started,
          queryStart: expect.any(Date),
          query: expect.stringContaining('SELECT now()'),
        },
      ]);
      await writer.sql`COMMIT`;
    } finally {
      await writer.close();
    }
    await waitForStatus(api, 'reading_values', 'live');
    await db.sql`UPDATE readings SET v = v + 1 WHERE id % 7 = 0`;
    const token = await api.watermarkToken();
    await api.awaitConverged('reading_values', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, values);
  });
});
