import type postgres from 'postgres';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Status, Trellis } from '../src/engine/index.js';
import { skipUnlessCi } from './support/ci.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// What a new transform's backfill waits on, and that status() names it (issue #8, "never
// silently wrong"): after capture of a source widens, only the transactions that held a
// writer lock on that source since before the widen (they may still run the older UPDATE
// trigger, which misses the newly captured columns); while capture is installed, every
// session or prepared transaction holding a conflicting lock.

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

/**
 * Defines a transform over a new table of its own and waits for it to go live: proof that
 * the staging worker ran reconcile passes (install, widen waits) and started backfills
 * since, so a transform still waiting was looked at and kept waiting, not overlooked.
 */
async function passesRan(db: TestDatabase, api: Trellis, name: string): Promise<void> {
  await db.sql.unsafe(`CREATE TABLE ${name} (id int PRIMARY KEY, v int NOT NULL);
                       INSERT INTO ${name} SELECT g, g FROM generate_series(1, 10) g;`);
  await api.apply(`TRANSFORM ${name}_copy FROM ${name} SELECT v`);
  await waitForStatus(api, `${name}_copy`, 'live');
}

describe('what a backfill waits on', () => {
  let db: TestDatabase;
  let api: Trellis;
  let worker: Trellis;
  let twoPhase = false;

  beforeAll(async () => {
    db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE gauges (id int PRIMARY KEY, level int NOT NULL, label text NOT NULL);
      INSERT INTO gauges SELECT g, g % 7, 'g' || g FROM generate_series(1, 200) g;
      CREATE TABLE meters (id int PRIMARY KEY, level int NOT NULL, label text NOT NULL);
      INSERT INTO meters SELECT g, g % 5, 'm' || g FROM generate_series(1, 200) g;
      CREATE TABLE valves (id int PRIMARY KEY, level int NOT NULL, label text NOT NULL);
      INSERT INTO valves SELECT g, g % 3, 'v' || g FROM generate_series(1, 200) g;
      CREATE TABLE readings (id int, site text, v int NOT NULL, PRIMARY KEY (id, site))
        PARTITION BY LIST (site);
      CREATE TABLE readings_a PARTITION OF readings FOR VALUES IN ('a');
      CREATE TABLE readings_b PARTITION OF readings FOR VALUES IN ('b');
      INSERT INTO readings SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g FROM generate_series(1, 100) g;
      CREATE TABLE logs (id int PRIMARY KEY, line text NOT NULL);
      CREATE TABLE logs_archive () INHERITS (logs);
      INSERT INTO logs SELECT g, 'l' || g FROM generate_series(1, 50) g;
      INSERT INTO logs_archive SELECT g, 'a' || g FROM generate_series(51, 80) g;
      CREATE TABLE crates (id int PRIMARY KEY, weight int NOT NULL);
      INSERT INTO crates SELECT g, g * 2 FROM generate_series(1, 100) g;
    `);
    twoPhase = await twoPhaseCommit(db.sql);
    api = await migratedTrellis(db);
    // The locks and waits of trigger capture (ADR 0009): with triggers whatever the suite's
    // capture is.
    worker = await migratedTrellis(db, { staging: true, drainThreads: 2, capture: 'trigger' });
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

  it('a transaction idle in another database does not hold up a backfill after a widen', async () => {
    const levels: Definition = {
      target: 'gauge_levels',
      from: 'gauges',
      select: 'level',
      implicit: 'id',
    };
    const labels: Definition = {
      target: 'gauge_labels',
      from: 'gauges',
      select: 'label',
      implicit: 'id',
    };
    await api.apply(transformStatement(levels));
    await waitForStatus(api, 'gauge_levels', 'live');

    // An old transaction, with an xid, left open in another database of the cluster: it
    // holds back every snapshot's xmin, here too, but it cannot touch this source.
    const other = await freshDatabase();
    await other.sql`CREATE TABLE notes (id int PRIMARY KEY)`;
    const idle = await openSession(other.url, 'elsewhere');
    try {
      await idle.sql`BEGIN`;
      await idle.sql`INSERT INTO notes VALUES (1)`;

      await api.apply(transformStatement(labels));
      await waitForStatus(api, 'gauge_labels', 'live', 15_000);
      expect(await capturedColumns(db.sql, 'public.gauges')).toEqual(['label', 'level']);
      const [still] = await db.sql`
        SELECT state, backend_xid IS NOT NULL AS has_xid FROM pg_stat_activity WHERE pid = ${idle.pid}`;
      expect(still).toEqual({ state: 'idle in transaction', has_xid: true });

      await db.sql`UPDATE gauges SET label = label || '!' WHERE id % 10 = 0`;
      const token = await api.watermarkToken();
      await api.awaitConverged('gauge_labels', token, { timeoutMs: 20_000 });
      await expectMatchesDefinition(db.sql, labels);
    } finally {
      await idle.close();
    }
  });

  it('a transaction holding the source since before a widen holds up the backfill, and status names it', async () => {
    const levels: Definition = {
      target: 'meter_levels',
      from: 'meters',
      select: 'level',
      implicit: 'id',
    };
    const labels: Definition = {
      target: 'meter_labels',
      from: 'meters',
      select: 'label',
      implicit: 'id',
    };
    await api.apply(transformStatement(levels));
    await waitForStatus(api, 'meter_levels', 'live');

    // A writer in a transaction that has already written the source (and so has run, and
    // cached, the UPDATE trigger as it is before the widen).
    const writer = await openSession(db.url, 'old-trigger-writer');
    const setLabel = (id: number, label: string) =>
      writer.sql`UPDATE meters SET label = ${label} WHERE id = ${id}`;
    try {
      await writer.sql`BEGIN`;
      await setLabel(1, 'before the widen');
      const [{ xid }] = (await writer.sql`SELECT pg_current_xact_id()::text AS xid`) as [
        { xid: string },
      ];
      const [{ started }] = (await writer.sql`SELECT now() AS started`) as [{ started: Date }];

      const defined = new Date();
      await api.apply(transformStatement(labels));
      await waitFor(
        async () => (await capturedColumns(db.sql, 'public.meters')).includes('label'),
        'capture of meters to widen to label',
      );
      let waiting: Status | undefined;
      await waitFor(async () => {
        waiting = await api.status('meter_labels');
        return waiting.captureWait?.operation === 'widen';
      }, 'status to report the wait');
      expect(waiting).toMatchObject({
        status: 'waiting_to_backfill',
        captureWait: {
          operation: 'widen',
          table: 'public.meters',
          lockMode: 'ROW EXCLUSIVE',
          prepared: [],
        },
      });
      expect(waiting!.captureWait!.since.getTime()).toBeGreaterThanOrEqual(
        defined.getTime() - 2_000,
      );
      expect(waiting!.captureWait!.blockers).toEqual([
        {
          pid: writer.pid,
          applicationName: 'old-trigger-writer',
          database: db.name,
          state: 'idle in transaction',
          xactStart: started,
          queryStart: expect.any(Date),
          query: expect.stringContaining('SELECT now()'),
        },
      ]);

      // Why it waits: the same statement, run again after the widen, still runs the older
      // trigger code (its function is cached, and the transaction takes no new lock that
      // would make it see the new one), so this change of a newly captured column never
      // reaches the ledger. A transaction started after the widen is captured.
      await setLabel(2, 'after the widen');
      const captured = await writer.sql`
        SELECT coalesce(array_agg(k ORDER BY k), '{}') AS keys
          FROM trellis.ledger l, unnest(l.keys) k WHERE l.xid = ${xid}::bigint`;
      expect(captured[0]!.keys).toEqual([]);
      await db.sql`UPDATE meters SET label = 'fresh' WHERE id = 3`;
      const [fresh] = await db.sql`
        SELECT count(*)::int AS n FROM trellis.ledger l, unnest(l.keys) k
         WHERE k = '3' AND l.source_id = (SELECT id FROM trellis.sources WHERE qualified = 'public.meters')`;
      expect(fresh!.n).toBeGreaterThan(0);

      // A backfill started now would read row 2 as it was, and no ledger row would ever
      // correct it: it waits while the writer is there, whatever else happens.
      await passesRan(db, api, 'side_meters');
      const still = await api.status('meter_labels');
      expect(still.status).toBe('waiting_to_backfill');
      expect(still.captureWait?.blockers.map((b) => b.pid)).toEqual([writer.pid]);
      // A widen takes no lock: it has no attempts to count.
      expect(still.captureWait?.attempts).toBeNull();

      await writer.sql`COMMIT`;
    } finally {
      await writer.close();
    }
    const live = await waitForStatus(api, 'meter_labels', 'live');
    expect(live.captureWait).toBeNull();
    const token = await api.watermarkToken();
    await api.awaitConverged('meter_labels', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, labels);
    const rows = await db.sql`SELECT id, label FROM meter_labels WHERE id <= 3 ORDER BY id`;
    expect(rows.map((r) => [r.id, r.label])).toEqual([
      [1, 'before the widen'],
      [2, 'after the widen'],
      [3, 'fresh'],
    ]);
  });

  it('a transaction prepared after running the older trigger code holds up the backfill until COMMIT PREPARED', async (ctx) => {
    if (!twoPhase) skipUnlessCi(ctx, NO_TWO_PHASE);
    const levels: Definition = {
      target: 'valve_levels',
      from: 'valves',
      select: 'level',
      implicit: 'id',
    };
    const labels: Definition = {
      target: 'valve_labels',
      from: 'valves',
      select: 'label',
      implicit: 'id',
    };
    await api.apply(transformStatement(levels));
    await waitForStatus(api, 'valve_levels', 'live');

    const writer = await openSession(db.url, 'two-phase-writer');
    const setLabel = (id: number, label: string) =>
      writer.sql`UPDATE valves SET label = ${label} WHERE id = ${id}`;
    try {
      await writer.sql`BEGIN`;
      await setLabel(1, 'before the widen');
      await api.apply(transformStatement(labels));
      await waitFor(
        async () => (await capturedColumns(db.sql, 'public.valves')).includes('label'),
        'capture of valves to widen to label',
      );
      await waitFor(
        async () =>
          (await api.status('valve_labels')).captureWait?.blockers.some(
            (b) => b.pid === writer.pid,
          ) === true,
        'status to name the writer',
      );
      await setLabel(2, 'after the widen');
      await writer.sql`PREPARE TRANSACTION 'trellis_test_valves'`;
    } finally {
      await writer.close();
    }

    // The session is gone; its transaction, and what the older trigger code missed in it,
    // is not.
    let waiting: Status | undefined;
    await waitFor(async () => {
      waiting = await api.status('valve_labels');
      return (waiting.captureWait?.prepared.length ?? 0) > 0;
    }, 'status to name the prepared transaction');
    expect(waiting).toMatchObject({
      status: 'waiting_to_backfill',
      captureWait: { operation: 'widen', table: 'public.valves', blockers: [] },
    });
    const [{ owner }] = (await db.sql`SELECT current_user AS owner`) as [{ owner: string }];
    expect(waiting!.captureWait!.prepared).toEqual([
      {
        gid: 'trellis_test_valves',
        owner,
        database: db.name,
        prepared: expect.any(Date),
        transaction: expect.stringMatching(/^\d+$/),
      },
    ]);
    await passesRan(db, api, 'side_valves');
    expect((await api.status('valve_labels')).status).toBe('waiting_to_backfill');

    await db.sql`COMMIT PREPARED 'trellis_test_valves'`;
    await waitForStatus(api, 'valve_labels', 'live');
    const token = await api.watermarkToken();
    await api.awaitConverged('valve_labels', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, labels);
    const rows = await db.sql`SELECT id, label FROM valve_labels WHERE id <= 2 ORDER BY id`;
    expect(rows.map((r) => [r.id, r.label])).toEqual([
      [1, 'before the widen'],
      [2, 'after the widen'],
    ]);
  });

  it('a prepared transaction that wrote a source blocks capture install, and status names it by gid', async (ctx) => {
    if (!twoPhase) skipUnlessCi(ctx, NO_TWO_PHASE);
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
    // The staging worker keeps trying (its attempts are counted), and fails each time.
    const tried = waiting!.captureWait!.attempts!;
    expect(tried).toBeGreaterThanOrEqual(1);
    await waitFor(
      async () => ((await api.status('crate_weights')).captureWait?.attempts ?? 0) >= tried + 2,
      'two more attempts to install capture',
    );
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

  it('an install waits for a session writing an inheritance child, and names it', async () => {
    const lines: Definition = { target: 'log_lines', from: 'logs', select: 'line', implicit: 'id' };
    const writer = await openSession(db.url, 'archive-writer');
    try {
      await writer.sql`BEGIN`;
      await writer.sql`INSERT INTO logs_archive VALUES (1000, 'archived')`;
      await api.apply(transformStatement(lines));
      let waiting: Status | undefined;
      await waitFor(async () => {
        waiting = await api.status('log_lines');
        return (waiting.captureWait?.blockers.length ?? 0) > 0;
      }, 'status to name the session holding the child table');
      expect(waiting).toMatchObject({
        status: 'waiting_to_backfill',
        captureWait: { operation: 'install', table: 'public.logs', prepared: [] },
      });
      expect(waiting!.captureWait!.blockers.map((b) => [b.pid, b.applicationName])).toEqual([
        [writer.pid, 'archive-writer'],
      ]);
      await writer.sql`COMMIT`;
    } finally {
      await writer.close();
    }
    await waitForStatus(api, 'log_lines', 'live');
    await db.sql`UPDATE logs SET line = line || '!' WHERE id % 6 = 0`;
    const token = await api.watermarkToken();
    await api.awaitConverged('log_lines', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, lines);
  });
});
