import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type LoggedLine, recordingLogger } from './support/logging.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor } from './support/trellis.js';

// I8, idle half: live transforms with nothing written cost next to nothing. No tick is
// taken (there is nothing to seal), so no cursor moves and no drain transaction runs; the
// workers wait for work inside one statement each, for seconds at a time. And a write
// after a long idle stretch still flows through. Nor is a sample of any transform written
// (the operations page's charts, ADR 0063): only a change brings one.

const TABLES = 30;

let db: TestDatabase;
let worker: Trellis;
/** Every line the worker's handle logged (debug included): its sample passes are counted. */
const lines: LoggedLine[] = [];

/** Waits for `n` more sample passes of the staging worker (one each 10 s); what each wrote. */
async function samplePasses(n: number): Promise<number[]> {
  const from = lines.length;
  const passes = () => lines.slice(from).filter((l) => l.msg === 'samples taken');
  await waitFor(async () => passes().length >= n, `${n} sample passes`, 20_000 + n * 10_000);
  return passes()
    .slice(0, n)
    .map((l) => l.obj.written as number);
}

const projection = (n: number): Definition => ({
  target: `idle_v${n}`,
  from: `idle_s${n}`,
  select: 'a',
  implicit: 'id',
});
const totals: Definition = {
  target: 'idle_totals',
  from: 'idle_s1',
  select: 'grp, count(*) AS n, sum(a) AS total',
  groupBy: 'grp',
};
const definitions = [...Array.from({ length: TABLES }, (_, i) => projection(i + 1)), totals];

/** The longest a worker stays inside one wait (their commits are counted when it ends). */
const LONGEST_WAIT_MS = 5_000;

/**
 * Waits until every wait the worker's sessions were in when this began has ended, `rounds`
 * times over: each worker (staging, drain loops, jobs) has ended a wait and had
 * its chance to act (tick, move a cursor, commit) that many times (a WAL decoder's
 * replication stream is one endless statement, not a wait: left out). Read from
 * pg_stat_activity's `query_start`, which only moves forward (not a sample of what runs),
 * by a session on another database, so that its own commits are not counted in this one's.
 */
async function workersWaited(rounds: number): Promise<void> {
  const u = new URL(db.url);
  u.pathname = '/postgres';
  const observer = sqlClient(u.toString(), { max: 1 });
  try {
    for (let round = 1; round <= rounds; round += 1) {
      const [mark] = await observer<{ at: string }[]>`SELECT clock_timestamp()::text AS at`;
      await waitFor(
        async () => {
          const [row] = await observer<{ n: number }[]>`
            SELECT count(*)::int AS n FROM pg_stat_activity
             WHERE datname = ${db.name} AND application_name LIKE 'trellis-pg%'
               AND backend_type = 'client backend' AND state = 'active' AND query_start < ${mark!.at}::timestamptz`;
          return row!.n === 0;
        },
        `round ${round} of the workers' waits ending`,
        4 * LONGEST_WAIT_MS,
      );
    }
  } finally {
    await observer.end({ timeout: 2 });
  }
}

beforeAll(async () => {
  db = await freshDatabase();
  for (let n = 1; n <= TABLES; n += 1) {
    await db.sql.unsafe(`
      CREATE TABLE idle_s${n} (id int PRIMARY KEY, a int NOT NULL, grp int NOT NULL);
      INSERT INTO idle_s${n} SELECT g, g, g % 7 FROM generate_series(1, 50) g;`);
  }
  await db.sql.unsafe('CREATE INDEX ON idle_s1 (grp)');
  worker = await migratedTrellis(db, {
    staging: true,
    drainThreads: 2,
    logger: recordingLogger(lines),
  });
  for (const d of definitions) await worker.define(transformStatement(d));
  const token = await worker.watermarkToken();
  for (const d of definitions) {
    await worker.awaitConverged(d.target, token, { timeoutMs: 60_000 });
  }
});

afterAll(async () => {
  await worker?.shutdown();
});

interface Snapshot {
  at: number;
  tick: string | null;
  /** Changes with any write to any pipeline row (a cursor moved, a phase changed…). */
  pipeline: string;
  commits: number;
}

async function snapshot(): Promise<Snapshot> {
  const [row] = await db.sql<{ tick: string | null; pipeline: string; commits: string }[]>`
    SELECT (SELECT max(seq)::text FROM trellis.ticks) AS tick,
           (SELECT string_agg(transform_id || ':' || xmin::text, ',' ORDER BY transform_id)
              FROM trellis.pipeline) AS pipeline,
           (SELECT xact_commit::text FROM pg_stat_database
             WHERE datname = current_database()) AS commits`;
  return {
    at: Date.now(),
    tick: row!.tick,
    pipeline: row!.pipeline,
    commits: Number(row!.commits),
  };
}

describe('an idle instance', () => {
  it('takes no tick, moves no cursor and commits next to nothing while nothing is written', async () => {
    for (const d of definitions) expect((await worker.status(d.target)).status).toBe('live');
    // Autovacuum has the new tables to analyse: done now, its commits would count below.
    await db.sql.unsafe('VACUUM ANALYZE');
    // Every worker has ended the wait it began while the transforms went live, and the
    // next one (a backend reports its commits when a transaction ends, at most once a
    // second): so no commit of that busy time is counted below.
    await workersWaited(2);
    const before = await snapshot();
    // Every worker has had two chances to tick, move a cursor or commit since `before`
    // (each ended two waits), and found nothing to do.
    await workersWaited(2);
    const after = await snapshot();
    expect(after.tick).toBe(before.tick);
    expect(after.pipeline).toBe(before.pipeline);
    // About 1-2 a second in fact (each worker's wait, its session check, this test's
    // queries, autovacuum's visits); before, every keepalive tick moved every cursor
    // in a transaction of its own: hundreds a second.
    const perSecond = (after.commits - before.commits) / ((after.at - before.at) / 1000);
    expect(perSecond).toBeLessThan(10);
  });

  it('writes no sample while nothing changes', { timeout: 90_000 }, async () => {
    // A pass after everything settled (the first test's time): each transform's latest
    // state is sampled by then.
    await samplePasses(1);
    const samples = async () =>
      (
        await db.sql<{ n: number; latest: string }[]>`
          SELECT count(*)::int AS n, max(at)::text AS latest FROM trellis.samples`
      )[0];
    const before = await samples();
    expect(before!.n).toBeGreaterThanOrEqual(definitions.length);
    // Two more passes, nothing written: the catalog's samples are as they were.
    expect(await samplePasses(2)).toEqual([0, 0]);
    expect(await samples()).toEqual(before);
  });

  it('still converges a write that comes after a long idle stretch', async () => {
    const before = await snapshot();
    const [latest] = await db.sql<{ keys: string }[]>`
      SELECT max(s.keys)::text AS keys FROM trellis.samples s
        JOIN trellis.transforms t ON t.id = s.transform_id WHERE t.target_name = 'idle_v7'`;
    const sampledKeys = Number(latest!.keys);
    await db.sql.unsafe(`
      INSERT INTO idle_s1 VALUES (1000, 1000, 3);
      UPDATE idle_s7 SET a = a + 1 WHERE id <= 10;
      DELETE FROM idle_s${TABLES} WHERE id > 40;`);
    const token = await worker.watermarkToken();
    for (const d of definitions) {
      await worker.awaitConverged(d.target, token, { timeoutMs: 30_000 });
      await expectMatchesDefinition(db.sql, d);
    }
    const after = await snapshot();
    expect(after.tick).not.toBe(before.tick);
    for (const d of definitions) expect((await worker.status(d.target)).status).toBe('live');
    // The change is sampled: a sample of idle_v7 with more changed keys than its latest
    // before the write.
    const keys = async () =>
      Number(
        (
          await db.sql<{ keys: string }[]>`
            SELECT max(s.keys)::text AS keys FROM trellis.samples s
              JOIN trellis.transforms t ON t.id = s.transform_id WHERE t.target_name = 'idle_v7'`
        )[0]!.keys,
      );
    await waitFor(async () => (await keys()) >= sampledKeys + 10, 'a sample of the write', 30_000);
  });
});
