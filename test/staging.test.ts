import type postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { LOCK_CLASS } from '../src/engine/internal/advisory-locks.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { announceSeed, scaled, testSeeds, timeoutFor } from './support/seeds.js';
import { migratedTrellis, quietLogger, waitFor, waitForStatus } from './support/trellis.js';
import { runWorkload } from './support/workload.js';
import { ACCOUNTS_DDL, accountsWorkload, seedAccounts } from './support/workload-accounts.js';

// The staging worker as an operator sees it (issue #4): capture that waits for a lock
// without blocking the app and says who holds it, a standby that takes over, a ledger
// reclaimed by TRUNCATE, capture that narrows again, and triggers that fire in
// replication mode.

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms)); // pacing of the writer (below)

/** The transforms this file defines, each as its statement means it. */
const D = {
  part_names: { target: 'part_names', from: 'parts', select: 'name, qty', implicit: 'id' },
  bin_sizes: { target: 'bin_sizes', from: 'bins', select: 'size', implicit: 'id' },
  acct_owners: {
    target: 'acct_owners',
    from: 'accounts',
    select: 'owner',
    where: "status = 'active'",
    implicit: 'id',
  },
  acct_balances: {
    target: 'acct_balances',
    from: 'accounts',
    select: 'owner, balance',
    implicit: 'id',
  },
  burst_values: { target: 'burst_values', from: 'bursts', select: 'v', implicit: 'id' },
  tool_labels: { target: 'tool_labels', from: 'tools', select: 'label', implicit: 'id' },
  tool_weights: { target: 'tool_weights', from: 'tools', select: 'label, weight', implicit: 'id' },
  job_states: {
    target: 'job_states',
    from: 'jobs',
    select: 'upper(state) AS state',
    where: 'id % 3 <> 0',
    implicit: 'id',
  },
  event_values: { target: 'event_values', from: 'events', select: 'v', implicit: 'id' },
  event_doubled: {
    target: 'event_doubled',
    from: 'events',
    select: 'v * 2 AS doubled',
    implicit: 'id',
  },
} satisfies Record<string, Definition>;

/** Waits for the target to take in every write so far, then compares it with its definition. */
async function converge(db: TestDatabase, trellis: Trellis, d: Definition): Promise<void> {
  const token = await trellis.watermarkToken();
  await trellis.awaitConverged(d.target, token, { timeoutMs: 20_000 });
  await expectMatchesDefinition(db.sql, d);
}

/** Sessions holding the instance's staging lock (the elected staging worker). */
async function stagingLockHolders(
  sql: postgres.Sql,
): Promise<Array<{ pid: number; application_name: string }>> {
  return sql<Array<{ pid: number; application_name: string }>>`
    SELECT l.pid, a.application_name
      FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = ${LOCK_CLASS.staging}::oid
       AND l.objid = ((hashtext('trellis')::bigint + 4294967296) % 4294967296)::oid
       AND l.objsubid = 2`;
}

/** Runs `write` in a transaction and says how many changed keys it added to the ledger. */
async function ledgerKeysOf(
  sql: postgres.Sql,
  write: (tx: postgres.TransactionSql) => Promise<unknown>,
): Promise<number> {
  const xid = await sql.begin(async (tx) => {
    await write(tx);
    const [row] = await tx`SELECT pg_current_xact_id()::text AS xid`;
    return row!.xid as string;
  });
  const [row] = await sql`
    SELECT coalesce(sum(cardinality(keys)), 0)::int AS n FROM trellis.ledger WHERE xid = ${xid}::bigint`;
  return row!.n as number;
}

/**
 * A session of its own (named `name` in pg_stat_activity) that has run `statement` in a
 * transaction it keeps open until `commit()`. `close()` ends the session (rolling back
 * what is still open).
 */
async function openTransaction(db: TestDatabase, name: string, statement: string) {
  // A client with one connection is a session of its own (no reserve(): postgres.js
  // 3.4.9 never hands out a reserved connection it opens with fetch_types off, ADR 0007).
  const session = sqlClient(db.url, { max: 1, connection: { application_name: name } });
  const [row] = await session`SELECT pg_backend_pid() AS pid`;
  await session`BEGIN`;
  await session.unsafe(statement);
  return {
    pid: row!.pid as number,
    commit: async () => {
      await session`COMMIT`;
    },
    close: async () => {
      await session.end({ timeout: 2 });
    },
  };
}

// The trigger capture mechanism (locks, ENABLE ALWAYS, widen and narrow) and the ledger's
// layout and rotation under it: run with triggers whatever the suite's capture is (WAL
// capture's own are in test/wal-*.test.ts and test/capture-*.test.ts).
describe('capture on a busy table', () => {
  let db: TestDatabase;
  /** A handle for calls only, as an app's web process would have. */
  let api: Trellis;
  let worker: Trellis;

  beforeAll(async () => {
    db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE parts (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL);
      INSERT INTO parts SELECT g, 'p' || g, g % 11 FROM generate_series(1, 300) g;
      CREATE TABLE tools (id int PRIMARY KEY, label text NOT NULL, weight int NOT NULL);
      INSERT INTO tools SELECT g, 't' || g, g % 5 FROM generate_series(1, 100) g;
      CREATE TABLE bins (id int PRIMARY KEY, size int NOT NULL);
      INSERT INTO bins SELECT g, g * 10 FROM generate_series(1, 50) g;
    `);
    api = await migratedTrellis(db);
    worker = await migratedTrellis(db, { staging: true, drainThreads: 2, capture: 'trigger' });
  });

  afterAll(async () => {
    await worker?.shutdown();
    await api?.shutdown();
  });

  it('waits for locks held by open transactions, names their holders, and never blocks writers', async () => {
    // App transactions still open on the source: one that wrote to it, one that locked it
    // as a writer would. Both hold ROW EXCLUSIVE, which conflicts with installing capture.
    const inserter = await openTransaction(
      db,
      'inserter',
      "INSERT INTO parts VALUES (1001, 'held', 1)",
    );
    const locker = await openTransaction(db, 'locker', 'LOCK TABLE parts IN ROW EXCLUSIVE MODE');
    const writerSql = sqlClient(db.url, { max: 1, connection: { application_name: 'writer' } });
    try {
      const defined = new Date();
      await api.apply(transformStatement(D.part_names));

      let waiting = await api.status('part_names');
      await waitFor(async () => {
        waiting = await api.status('part_names');
        const pids = waiting.captureWait?.blockers.map((b) => b.pid) ?? [];
        return pids.includes(inserter.pid) && pids.includes(locker.pid);
      }, 'status to name the blocking sessions');
      expect(waiting).toMatchObject({
        status: 'waiting_to_backfill',
        captureWait: {
          operation: 'install',
          lockMode: 'SHARE ROW EXCLUSIVE',
          table: 'public.parts',
        },
      });
      const wait = waiting.captureWait!;
      expect(wait.since).toBeInstanceOf(Date);
      expect(wait.since.getTime()).toBeGreaterThanOrEqual(defined.getTime() - 2_000);
      expect(wait.since.getTime()).toBeLessThanOrEqual(Date.now() + 2_000);
      expect(wait.blockers.find((b) => b.pid === inserter.pid)).toMatchObject({
        applicationName: 'inserter',
        state: 'idle in transaction',
        query: expect.stringContaining('INSERT INTO parts'),
      });
      expect(wait.blockers.find((b) => b.pid === locker.pid)).toMatchObject({
        applicationName: 'locker',
        state: 'idle in transaction',
        query: expect.stringContaining('LOCK TABLE parts'),
      });

      // The app goes on writing meanwhile: a writer may queue behind one of the staging
      // worker's short lock attempts, never behind the blockers for good.
      for (let i = 0; i < 8; i += 1) {
        await writerSql.begin(async (tx) => {
          await tx`SET LOCAL lock_timeout = '10s'`;
          await tx`INSERT INTO parts VALUES (${2000 + i}, ${`w${i}`}, ${i})`;
        });
        await sleep(150); // pacing: writes spread over the lock attempts
      }
      const [{ n }] = (await writerSql`SELECT count(*)::int AS n FROM parts WHERE id >= 2000`) as [
        { n: number },
      ];
      expect(n).toBe(8);

      // A transform over another table is not held up by this one's wait.
      await api.apply(transformStatement(D.bin_sizes));
      await waitForStatus(api, 'bin_sizes', 'live', 30_000);
      await converge(db, api, D.bin_sizes);
      expect((await api.status('part_names')).status).toBe('waiting_to_backfill');

      // One blocker ends: still waiting, since the same moment, on the other alone.
      await inserter.commit();
      await waitFor(async () => {
        waiting = await api.status('part_names');
        const pids = waiting.captureWait?.blockers.map((b) => b.pid) ?? [];
        return !pids.includes(inserter.pid);
      }, 'the committed transaction to drop out of the blockers');
      expect(waiting.status).toBe('waiting_to_backfill');
      expect(waiting.captureWait?.since.getTime()).toBe(wait.since.getTime());
      expect(waiting.captureWait?.blockers.map((b) => b.pid)).toContain(locker.pid);

      await locker.commit();
    } finally {
      await inserter.close();
      await locker.close();
      await writerSql.end({ timeout: 2 });
    }
    const live = await waitForStatus(api, 'part_names', 'live');
    expect(live.captureWait).toBeNull();
    await converge(db, api, D.part_names);
    const rows = await db.sql`SELECT id FROM part_names WHERE id = 1001 OR id >= 2000 ORDER BY id`;
    expect(rows.map((r) => r.id)).toEqual([1001, 2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007]);
  });

  it('summarises the ledger index behind a burst, so a later range reads only its tail', async () => {
    await db.sql.unsafe('CREATE TABLE bursts (id int PRIMARY KEY, v int NOT NULL)');
    await api.apply(transformStatement(D.burst_values));
    await waitForStatus(api, 'burst_values', 'live');
    // A ledger row per statement: 40,000 single-row statements.
    await db.sql.unsafe(`
      DO $$ BEGIN
        FOR i IN 1..40000 LOOP INSERT INTO bursts VALUES (i, i); END LOOP;
      END $$`);
    await converge(db, api, D.burst_values);
    const [{ blocks } = { blocks: 0 }] = await db.sql<{ blocks: number }[]>`
      SELECT sum(pg_relation_size(inhrelid) / 8192)::int AS blocks FROM pg_inherits
       WHERE inhparent = 'trellis.ledger'::regclass`;
    // The ledger pages a drain reads for the range holding one more change, as it would
    // find them: through the ledger's BRIN index.
    const blocksRead = async (): Promise<number> => {
      const [{ snap: lo } = { snap: '' }] = await db.sql<{ snap: string }[]>`
        SELECT snap::text AS snap FROM trellis.ticks ORDER BY seq DESC LIMIT 1`;
      await db.sql`INSERT INTO bursts VALUES (200000 + (random() * 1e6)::int, 1)`;
      return db.sql.begin(async (tx) => {
        await tx`SET LOCAL enable_seqscan = off`;
        const [row] = await tx`
          EXPLAIN (ANALYZE, FORMAT JSON)
          SELECT count(*) FROM trellis.ledger l
           WHERE l.xid >= pg_snapshot_xmin(${lo}::pg_snapshot)::text::bigint
             AND l.xid < pg_snapshot_xmax(pg_current_snapshot())::text::bigint`;
        let read = 0;
        const walk = (node: Record<string, unknown>) => {
          read += Number(node['Exact Heap Blocks'] ?? 0) + Number(node['Lossy Heap Blocks'] ?? 0);
          for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? [])
            walk(child);
        };
        walk((row!['QUERY PLAN'] as Array<{ Plan: Record<string, unknown> }>)[0]!.Plan);
        return read;
      });
    };
    expect(blocks).toBeGreaterThan(200);
    await waitFor(
      async () => (await blocksRead()) <= 64,
      `range queries to read only the tail of a ${blocks}-block ledger`,
      10_000,
    );
  });

  it('installs capture triggers ENABLE ALWAYS, so replication-mode writes are captured', async () => {
    await api.apply(transformStatement(D.tool_labels));
    await converge(db, api, D.tool_labels);
    const triggers = await db.sql`
      SELECT tgname, tgenabled FROM pg_trigger
       WHERE tgrelid = 'tools'::regclass AND NOT tgisinternal ORDER BY tgname`;
    expect(triggers.map((t) => [t.tgname, t.tgenabled])).toEqual([
      ['trellis_capture_delete', 'A'],
      ['trellis_capture_insert', 'A'],
      ['trellis_capture_truncate', 'A'],
      ['trellis_capture_update', 'A'],
    ]);

    // As a logical-replication apply worker or a pg_restore --disable-triggers would write.
    await db.sql.begin(async (tx) => {
      await tx`SET LOCAL session_replication_role = replica`;
      await tx`INSERT INTO tools VALUES (500, 'replicated', 1)`;
      await tx`UPDATE tools SET label = 'relabelled' WHERE id = 3`;
      await tx`DELETE FROM tools WHERE id = 4`;
    });
    await converge(db, api, D.tool_labels);
    const rows =
      await db.sql`SELECT id, label FROM tool_labels WHERE id IN (3, 4, 500) ORDER BY id`;
    expect(rows.map((r) => [r.id, r.label])).toEqual([
      [3, 'relabelled'],
      [500, 'replicated'],
    ]);
  });

  it('narrows capture again when the transform that read more columns is dropped', async () => {
    await api.apply(transformStatement(D.tool_weights));
    await converge(db, api, D.tool_weights);
    const weightUpdate = (tx: postgres.TransactionSql) =>
      tx`UPDATE tools SET weight = weight + 1 WHERE id = 7`;
    expect(await ledgerKeysOf(db.sql, weightUpdate)).toBe(1);

    await api.apply('DROP TRANSFORM tool_weights');
    await waitFor(
      async () => (await ledgerKeysOf(db.sql, weightUpdate)) === 0,
      'an UPDATE of weight alone to be captured no more',
    );
    // What tool_labels reads is still captured, and it still follows its source.
    const labelUpdate = (tx: postgres.TransactionSql) =>
      tx`UPDATE tools SET label = label || '!' WHERE id = 7`;
    expect(await ledgerKeysOf(db.sql, labelUpdate)).toBe(1);
    await converge(db, api, D.tool_labels);
  });
});

/**
 * Capture installed, then widened, on a table that random writers (some in long and
 * multi-statement transactions) hold all along: no change may be lost.
 */
describe.each(testSeeds([4], 10))('capture installed under concurrent writes (seed %i)', (seed) => {
  it('installs and widens capture on a table being written to, losing no change', {
    timeout: timeoutFor(60_000),
  }, async () => {
    announceSeed('staging', seed, 'test/staging.test.ts');
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(5_000));
    await using api = await migratedTrellis(db);
    await using _worker = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      capture: 'trigger',
    });
    // Capture is installed once a quarter of the writers' steps are done, and widened
    // before any writer takes its last quarter: both happen between writes, and the
    // counts below show it rather than assume it.
    const operations = scaled(360);
    const writers = 3;
    let steps = 0;
    let quarterDone: () => void = () => undefined;
    const quarter = new Promise<void>((resolve) => {
      quarterDone = resolve;
    });
    let widened: () => void = () => undefined;
    const widenDone = new Promise<void>((resolve) => {
      widened = resolve;
    });
    const writes = runWorkload(db.sql, accountsWorkload(5_000), {
      seed,
      writers,
      operations,
      longTransactions: scaled(3),
      holdAt: { step: Math.floor((operations * 3) / 4), until: widenDone },
      onStep: () => {
        steps += 1;
        if (steps >= (operations * writers) / 4) quarterDone();
      },
    });
    // Awaited below; a failure meanwhile is not an unhandled rejection.
    writes.catch(() => undefined);
    await Promise.race([quarter, writes]);
    const stepsBeforeInstall = steps;
    // Installed while writers (some in multi-statement transactions) hold the table...
    await api.apply(transformStatement(D.acct_owners));
    await waitForStatus(api, 'acct_owners', 'live');
    // ...and widened to a column no transform read before.
    await api.apply(transformStatement(D.acct_balances));
    const stepsBeforeWiden = steps;
    widened();
    const result = await writes;
    console.log(
      `[workload] staging ${seed} ${JSON.stringify({ ...result, stepsBeforeInstall, stepsBeforeWiden })}`,
    );
    expect(stepsBeforeInstall).toBeGreaterThanOrEqual((operations * writers) / 4);
    // Every writer still had its last quarter to go when the widen committed.
    expect(operations * writers - stepsBeforeWiden).toBeGreaterThanOrEqual(
      writers * (operations - Math.floor((operations * 3) / 4)),
    );
    expect(result.committed).toBeGreaterThan(50);
    expect(result.longTransactions).toBe(scaled(3));
    await converge(db, api, D.acct_owners);
    await converge(db, api, D.acct_balances);
  });
});

describe('standby staging workers', () => {
  let db: TestDatabase;
  let api: Trellis;
  const handles = new Map<string, Trellis>();

  async function startNode(name: string): Promise<void> {
    handles.set(
      name,
      await migratedTrellis(db, { staging: true, drainThreads: 1, applicationName: name }),
    );
  }

  /** The node whose staging worker holds the lock, once exactly one does. */
  async function leader(): Promise<{ name: string; pid: number }> {
    let found: { name: string; pid: number } | undefined;
    await waitFor(async () => {
      const holders = await stagingLockHolders(db.sql);
      if (holders.length !== 1) return false;
      found = { name: holders[0]!.application_name.replace(/:worker$/, ''), pid: holders[0]!.pid };
      return true;
    }, 'one staging worker to hold the lock');
    return found!;
  }

  async function writeAndConverge(round: number): Promise<void> {
    await db.sql.unsafe(`
      INSERT INTO jobs SELECT g, 'r${round}-' || g FROM generate_series(${round * 1000}, ${round * 1000 + 49}) g;
      UPDATE jobs SET state = state || '+' WHERE id % 10 = ${round};
      DELETE FROM jobs WHERE id % 37 = ${round};
    `);
    await converge(db, api, D.job_states);
  }

  beforeAll(async () => {
    db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL);
      INSERT INTO jobs SELECT g, 'new' FROM generate_series(1, 200) g;
    `);
    api = await migratedTrellis(db);
  });

  afterAll(async () => {
    for (const handle of handles.values()) await handle.shutdown();
    await api?.shutdown();
  });

  /** Waits (a few seconds at most) for a leader other than `previous`. */
  async function newLeader(previous: { pid: number }): Promise<{ name: string; pid: number }> {
    let found: { name: string; pid: number } | undefined;
    await waitFor(
      async () => {
        found = await leader();
        return found.pid !== previous.pid;
      },
      'a staging worker on another session to take the lock',
      10_000,
    );
    return found!;
  }

  it('elects one staging worker of two, and the standby takes over when the leader shuts down', async () => {
    await startNode('node-a');
    await startNode('node-b');
    await api.apply(transformStatement(D.job_states));
    await waitForStatus(api, 'job_states', 'live');
    await converge(db, api, D.job_states);
    expect(await api.hasLiveStagingWorker()).toBe(true);
    // Both run; exactly one session holds the staging lock.
    const first = await leader();
    expect(['node-a', 'node-b']).toContain(first.name);

    await handles.get(first.name)!.shutdown();
    handles.delete(first.name);
    const second = await newLeader(first);
    expect(second.name).toBe(first.name === 'node-a' ? 'node-b' : 'node-a');
    expect(await api.hasLiveStagingWorker()).toBe(true);
    await writeAndConverge(1);
  });

  it('takes the lock again when the leader’s session is killed', async () => {
    await startNode('node-c');
    const killed = await leader();
    const [terminated] = await db.sql`SELECT pg_terminate_backend(${killed.pid}) AS ok`;
    expect(terminated?.ok).toBe(true);
    // The standby, or the old leader on a new session, whichever asks first.
    const next = await newLeader(killed);
    expect([...handles.keys()]).toContain(next.name);
    expect(await api.hasLiveStagingWorker()).toBe(true);
    await writeAndConverge(2);
  });

  it('reports no live workers once every worker handle is shut down', async () => {
    for (const [name, handle] of handles) {
      await handle.shutdown();
      handles.delete(name);
    }
    expect(await api.hasLiveStagingWorker()).toBe(false);
    expect(await api.hasLiveDrainWorkers()).toBe(false);
    expect(await stagingLockHolders(db.sql)).toEqual([]);
  });
});

describe('ledger rotation', () => {
  let db: TestDatabase;
  let api: Trellis;
  let worker: Trellis;

  interface Partition {
    gen: number;
    rows: number;
    /** Changes when the partition is truncated (and only then). */
    relfilenode: string;
  }

  /** Each generation's changed keys and storage file, in one snapshot. */
  async function partitions(): Promise<Partition[]> {
    return db.sql<Partition[]>`
      SELECT g::int AS gen,
             (CASE g WHEN 0 THEN (SELECT coalesce(sum(cardinality(keys)), 0) FROM trellis.ledger_0)
                     WHEN 1 THEN (SELECT coalesce(sum(cardinality(keys)), 0) FROM trellis.ledger_1)
                     ELSE (SELECT coalesce(sum(cardinality(keys)), 0) FROM trellis.ledger_2) END)::int AS rows,
             c.relfilenode::text AS relfilenode
        FROM generate_series(0, 2) g
        JOIN pg_class c ON c.relnamespace = 'trellis'::regnamespace AND c.relname = 'ledger_' || g
       ORDER BY g`;
  }

  /** The generation this session's next transaction writes to. */
  async function currentGeneration(): Promise<number> {
    const [row] = await db.sql`
      SELECT trellis.ledger_generation(pg_snapshot_xmax(pg_current_snapshot())::text::bigint)::int AS gen`;
    return row!.gen as number;
  }

  /**
   * Moves the xid counter on by a whole epoch (65,536 xids): transactions after it write
   * the next generation. Subtransactions that each write take an xid apiece.
   */
  async function nextEpoch(): Promise<void> {
    await db.sql.unsafe(`
      DO $$ BEGIN
        FOR i IN 1..66000 LOOP
          BEGIN INSERT INTO xid_burner VALUES (i); EXCEPTION WHEN others THEN NULL; END;
        END LOOP;
      END $$`);
    await db.sql`TRUNCATE xid_burner`;
  }

  /**
   * Waits until `done`, writing a row now and then meanwhile, as an app goes on writing: a
   * generation is truncated once the oldest cursor's tick postdates every transaction of
   * its epoch, in the whole cluster (other test files' transactions count), and ticks come
   * only with writes (ADR 0012).
   */
  async function whileWriting(done: () => Promise<boolean>, what: string): Promise<void> {
    let wroteAt = 0;
    try {
      await waitFor(async () => {
        if (Date.now() - wroteAt >= 200) {
          await db.sql`UPDATE events SET v = v + 1 WHERE id = 100`;
          wroteAt = Date.now();
        }
        return done();
      }, what);
    } catch (error) {
      // What maintenance saw: the oldest cursor's tick, and transactions that held it back.
      const state = await db.sql`
        SELECT (SELECT json_agg(json_build_object('seq', seq, 'xmin', pg_snapshot_xmin(snap)::text))
                  FROM (SELECT * FROM trellis.ticks ORDER BY seq DESC LIMIT 3) k) AS ticks,
               (SELECT json_agg(json_build_object('id', transform_id, 'cursor', cursor_tick, 'phase', phase))
                  FROM trellis.pipeline) AS cursors,
               pg_snapshot_xmax(pg_current_snapshot())::text AS next_xid,
               (SELECT json_agg(json_build_object('pid', pid, 'db', datname, 'xid', backend_xid::text,
                                                  'state', state, 'query', left(query, 80)))
                  FROM pg_stat_activity WHERE backend_xid IS NOT NULL) AS writers,
               (SELECT json_agg(gid) FROM pg_prepared_xacts) AS prepared`;
      throw new Error(`${(error as Error).message}: ${JSON.stringify(state[0])}`);
    }
  }

  async function ledgerDeletes(): Promise<number> {
    const [row] = await db.sql`
      SELECT coalesce(sum(n_tup_del), 0)::int AS n FROM pg_stat_user_tables
       WHERE schemaname = 'trellis' AND relname IN ('ledger_0', 'ledger_1', 'ledger_2')`;
    return row!.n as number;
  }

  beforeAll(async () => {
    db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE events (id int PRIMARY KEY, v int NOT NULL);
      CREATE UNLOGGED TABLE xid_burner (n int);
      INSERT INTO events SELECT g, 0 FROM generate_series(1, 100) g;
    `);
    api = await migratedTrellis(db);
    worker = await migratedTrellis(db, { staging: true, drainThreads: 2, capture: 'trigger' });
    await api.apply(transformStatement(D.event_values));
    await waitForStatus(api, 'event_values', 'live');
  });

  afterAll(async () => {
    await worker?.shutdown();
    await api?.shutdown();
  });

  it('moves writes on to the next generation each epoch and reclaims passed ones by TRUNCATE', async () => {
    const before = new Map((await partitions()).map((p) => [p.gen, p.relfilenode]));
    const first = await currentGeneration();
    await db.sql`UPDATE events SET v = v + 1 WHERE id <= 30`;
    expect((await partitions())[first]!.rows).toBeGreaterThanOrEqual(30);

    await nextEpoch();
    const second = await currentGeneration();
    expect(second).toBe((first + 1) % 3);
    await db.sql`UPDATE events SET v = v + 1 WHERE id > 30`;
    expect((await partitions())[second]!.rows).toBeGreaterThanOrEqual(70);
    await converge(db, api, D.event_values);

    // Every cursor has passed the first epoch's rows: that generation is truncated.
    await whileWriting(async () => {
      const p = (await partitions())[first]!;
      return p.rows === 0 && p.relfilenode !== before.get(first);
    }, `generation ${first} to be truncated`);
    // The current epoch's generation is never truncated, whatever the cursors.
    expect((await partitions())[second]!.rows).toBeGreaterThanOrEqual(70);

    await nextEpoch();
    await db.sql`UPDATE events SET v = v + 1 WHERE id = 1`;
    await converge(db, api, D.event_values);
    await whileWriting(
      async () => (await partitions())[second]!.rows === 0,
      `generation ${second} to be truncated`,
    );
    // By TRUNCATE: not one ledger row was deleted.
    expect(await ledgerDeletes()).toBe(0);
  });

  it('keeps a generation a paused transform still needs, and frees it after RESUME', async () => {
    await api.apply(transformStatement(D.event_doubled));
    await waitForStatus(api, 'event_doubled', 'live');
    await converge(db, api, D.event_doubled);
    await api.apply('PAUSE TRANSFORM event_doubled');

    const gen = await currentGeneration();
    await db.sql`UPDATE events SET v = v + 100 WHERE id <= 20`;
    const held = (await partitions())[gen]!;
    expect(held.rows).toBeGreaterThanOrEqual(20);

    // The epoch moves on and the live transform passes these rows...
    await nextEpoch();
    await db.sql`UPDATE events SET v = v + 1 WHERE id = 99`;
    await converge(db, api, D.event_values);
    // ...but the generation stays, rows and storage, through maintenance passes while
    // paused: a staging worker starting up runs one at once (this one is seen to), and
    // later ones run only when the oldest cursor, this paused one, moves.
    const passes: Array<Record<string, unknown>> = [];
    await worker.shutdown();
    worker = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      capture: 'trigger',
      logger: {
        ...quietLogger,
        debug: (obj, msg) => {
          if (msg === 'ledger maintenance pass') passes.push(obj);
        },
      },
    });
    await whileWriting(async () => passes.length > 0, 'a ledger maintenance pass');
    expect((await partitions())[gen]).toMatchObject({ relfilenode: held.relfilenode });
    expect((await partitions())[gen]!.rows).toBeGreaterThanOrEqual(20);
    expect((await api.status('event_doubled')).status).toBe('paused');

    await api.apply('RESUME TRANSFORM event_doubled');
    await converge(db, api, D.event_doubled);
    await whileWriting(async () => {
      const p = (await partitions())[gen]!;
      return p.rows === 0 && p.relfilenode !== held.relfilenode;
    }, `generation ${gen} to be truncated once the resumed transform passed it`);
    expect(await ledgerDeletes()).toBe(0);
  });
});
