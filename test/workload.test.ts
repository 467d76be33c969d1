import { describe, expect, it } from 'vitest';
import { freshDatabase, sqlClient } from './support/database.js';
import {
  planFingerprint,
  planWorkload,
  runPlan,
  runWorkload,
  SuspectWriteError,
  type WorkloadShape,
} from './support/workload.js';
import { accountsWorkload } from './support/workload-accounts.js';
import { ordersWorkload } from './support/workload-orders.js';

// The randomized tests lean on two promises of the workload: a seed replays the same
// operations, and a write error Trellis could have caused fails the run instead of being
// shrugged off. Both are checked here.

describe('a workload plan', () => {
  const options = { seed: 7, writers: 3, operations: 60, truncates: 2, longTransactions: 3 };

  it('is the same for the same seed, and different for another', () => {
    for (const shape of [accountsWorkload(1_000), ordersWorkload()]) {
      const plan = planWorkload(shape, options);
      expect(planWorkload(shape, options)).toEqual(plan);
      expect(planFingerprint(planWorkload(shape, { ...options, seed: 8 }))).not.toBe(
        planFingerprint(plan),
      );
    }
  });

  it('gives every writer a stream of its own, and as many special steps as asked', () => {
    const plan = planWorkload(accountsWorkload(1_000), options);
    expect(plan.map((steps) => steps.length)).toEqual([60, 60, 60]);
    expect(new Set(plan.map((steps) => JSON.stringify(steps))).size).toBe(3);
    const all = plan.flat();
    expect(all.filter((s) => s.kind === 'truncate')).toHaveLength(2);
    expect(all.filter((s) => s.kind === 'transaction' && s.holdMs > 0)).toHaveLength(3);
    expect(all.some((s) => s.kind === 'transaction' && s.rollback)).toBe(true);
    expect(
      all.some(
        (s) => s.kind === 'transaction' && s.body.some((p) => typeof p !== 'string' && p.rollback),
      ),
    ).toBe(true);
  });

  it('holds no transaction open across steps when the server is restarted under it', () => {
    const plan = planWorkload(accountsWorkload(1_000), {
      ...options,
      truncates: 0,
      survivesRestarts: true,
    });
    const all = plan.flat();
    // Short transactions (written out statement by statement) still run; long ones,
    // which a restart would cut for certain, are not planned.
    expect(all.some((s) => s.kind === 'transaction')).toBe(true);
    expect(all.filter((s) => s.kind === 'transaction' && s.holdMs > 0)).toHaveLength(0);
  });
});

/** A shape whose writers run fixed statements in turn (writer i: statements[i]). */
function scripted(tables: string[], statements: string[][]): WorkloadShape {
  return {
    tables,
    writer(_dice, writer) {
      let i = 0;
      const own = statements[writer]!;
      return {
        statement: () => own[i++ % own.length]!,
        truncate: () => `TRUNCATE ${tables[0]}`,
      };
    },
  };
}

describe('running a workload', () => {
  it('counts what writers cause each other, and fails on what Trellis could have caused', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE mine (id int PRIMARY KEY, v int NOT NULL);
      CREATE TABLE theirs (id int PRIMARY KEY, v int NOT NULL);
      INSERT INTO mine VALUES (1, 0), (2, 0);
      INSERT INTO theirs VALUES (1, 0);
      CREATE FUNCTION capture_broken() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'broken capture'; END $$;
      CREATE TABLE captured (id int PRIMARY KEY);
      CREATE TRIGGER broken AFTER INSERT ON captured FOR EACH STATEMENT EXECUTE FUNCTION capture_broken();`);
    // Deadlocks found in 50 ms rather than a second (sessions opened from here on).
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET deadlock_timeout = '50ms'`);
    const sql = sqlClient(db.url);

    // Two writers, one long transaction each, locking the same two rows in opposite
    // orders: a deadlock between the workload's own writers, counted.
    const crossed = scripted(
      ['mine'],
      [
        ['UPDATE mine SET v = v + 1 WHERE id = 1', 'UPDATE mine SET v = v + 1 WHERE id = 2'],
        ['UPDATE mine SET v = v + 1 WHERE id = 2', 'UPDATE mine SET v = v + 1 WHERE id = 1'],
      ],
    );
    const own = await runWorkload(sql, crossed, {
      seed: 1,
      writers: 2,
      operations: 1,
      longTransactions: 2,
    });
    expect(own.expected.deadlock).toBeGreaterThan(0);
    expect(own.longTransactions).toBe(2);

    // The same on a pool of two connections, each held by a writer's transaction: the
    // victim looks its deadlock up on its own transaction's connection. (On a connection
    // from the pool it waited forever: the other writer, waiting for the victim's locks,
    // held the other one. The differential test hung so.)
    const tight = sqlClient(db.url, { max: 2 });
    const squeezed = await Promise.race([
      runWorkload(tight, crossed, { seed: 1, writers: 2, operations: 1, longTransactions: 2 }),
      new Promise<never>(
        (_, reject) =>
          setTimeout(() => reject(new Error('the writers hung on a pool of two')), 30_000), // a deadline, not a wait
      ),
    ]);
    expect(squeezed.expected.deadlock).toBeGreaterThan(0);
    expect(squeezed.longTransactions).toBe(2);
    await tight.end({ timeout: 2 });

    // A unique violation on a table the workload writes: counted.
    const clash = scripted(['mine'], [['UPDATE mine SET id = 2 WHERE id = 1']]);
    const clashed = await runWorkload(sql, clash, { seed: 1, writers: 1, operations: 3 });
    expect(clashed.expected.uniqueViolation).toBeGreaterThanOrEqual(3);
    expect(clashed.committed).toBe(0);

    // The same deadlock over a table the workload does not own (as Trellis's ledger or a
    // target would be): fails the run.
    const foreign = scripted(
      ['mine'],
      [
        ['LOCK TABLE mine IN EXCLUSIVE MODE', 'LOCK TABLE theirs IN EXCLUSIVE MODE'],
        ['LOCK TABLE theirs IN EXCLUSIVE MODE', 'LOCK TABLE mine IN EXCLUSIVE MODE'],
      ],
    );
    await expect(
      runWorkload(sql, foreign, { seed: 1, writers: 2, operations: 1, longTransactions: 2 }),
    ).rejects.toThrow(/deadlock involving public\.theirs/);

    // An error raised inside a capture trigger, and any unexpected error: fail the run.
    const broken = scripted(['captured'], [['INSERT INTO captured VALUES (1)']]);
    const failed = await runWorkload(sql, broken, { seed: 1, writers: 1, operations: 1 }).catch(
      (error: unknown) => error,
    );
    expect(failed).toBeInstanceOf(SuspectWriteError);
    expect((failed as Error).message).toMatch(/inside a capture trigger/);
    const dividing = scripted(['mine'], [['UPDATE mine SET v = 1 / 0']]);
    await expect(
      runWorkload(sql, dividing, { seed: 1, writers: 1, operations: 1 }),
    ).rejects.toThrow(/an unexpected error: 22012/);
    await sql.end({ timeout: 2 });
  });
});

describe('a COPY step', () => {
  it("loads its rows, and its errors are sorted as any statement's (alone, in a transaction, in a savepoint)", async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE SCHEMA other;
      CREATE TABLE other.loaded (id int PRIMARY KEY, t text);
      CREATE FUNCTION capture_broken() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'broken capture'; END $$;
      CREATE TABLE captured (id int PRIMARY KEY);
      CREATE TRIGGER broken AFTER INSERT ON captured FOR EACH STATEMENT EXECUTE FUNCTION capture_broken();`);
    const sql = sqlClient(db.url);
    const copy = (table: string, lines: string[]) =>
      `COPY ${table} (id${table === 'captured' ? '' : ', t'}) FROM STDIN;\n${lines.map((l) => `${l}\n`).join('')}\\.`;
    const ok = await runPlan(
      sql,
      [
        [
          { kind: 'statement', sql: copy('other.loaded', ['1\ta', '2\t\\N', "3\tit's"]) },
          // The last row's key is taken: the server reports it once every row is sent.
          { kind: 'statement', sql: copy('other.loaded', ['4\tb', '1\tc']) },
          {
            kind: 'transaction',
            body: [
              copy('other.loaded', ['5\td']),
              { savepoint: [copy('other.loaded', ['2\te'])], rollback: false },
              copy('other.loaded', ['6\tf']),
            ],
            rollback: false,
            holdMs: 0,
          },
        ],
      ],
      ['other.loaded'],
      {},
    );
    expect(ok.expected.uniqueViolation).toBe(2);
    expect(await sql`SELECT id, t FROM other.loaded ORDER BY id`).toEqual([
      { id: 1, t: 'a' },
      { id: 2, t: null },
      { id: 3, t: "it's" },
      { id: 5, t: 'd' },
      { id: 6, t: 'f' },
    ]);
    // An error raised inside a capture trigger fails the run, COPY or not.
    await expect(
      runPlan(sql, [[{ kind: 'statement', sql: copy('captured', ['1']) }]], ['captured'], {}),
    ).rejects.toThrow(/inside a capture trigger/);
    await sql.end({ timeout: 2 });
  });
});
