// One expensive transform never delays the others (issue #22 item 4, ADR 0045): while a
// transform's pages are being applied (here: held in progress by a lock the test takes on
// its target, so "expensive" takes no time to set up and lasts exactly as long as the
// test wants), another transform's changes still converge, and status() shows what the
// drain spent on each.
import { describe, expect, it } from 'vitest';
import { TEST_CAPTURE, waitUntilOnTheSlot } from './support/capture-mode.js';
import { freshDatabase, sqlClient } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// More changed keys than a drain page holds (20,000): the range becomes pages, in
// buckets that two loops could apply at once.
const BIG_ROWS = 45_000;

const HEAVY: Definition = { target: 'heavy', from: 'big', select: 'id, v * 2 AS v2' };
const CHEAP: Definition = {
  target: 'cheap',
  from: 'small',
  select: 'k, count(*) AS n, sum(v) AS total',
  groupBy: 'k',
};

describe('fair drain', { timeout: 180_000 }, () => {
  it("a cheap transform converges while an expensive one's pages are in progress, and status() shows each one's share of drain time", async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL);
      INSERT INTO big SELECT g, g FROM generate_series(1, ${BIG_ROWS}) g;
      CREATE TABLE small (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL);
      CREATE INDEX ON small (k);
      INSERT INTO small SELECT g, g % 10, g FROM generate_series(1, 100) g;`);
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    await trellis.apply(transformStatement(HEAVY));
    await trellis.apply(transformStatement(CHEAP));
    await waitForStatus(trellis, HEAVY.target, 'live', 60_000);
    await waitForStatus(trellis, CHEAP.target, 'live', 60_000);
    if (TEST_CAPTURE === 'logical') await waitUntilOnTheSlot(db.sql);

    // The heavy target is locked against writes: the drain loop that takes one of its
    // pages waits, holding it, until the test lets go (one connection: max 1).
    const holder = sqlClient(db.url, { max: 1 });
    try {
      await holder.unsafe('BEGIN');
      await holder.unsafe('LOCK TABLE heavy IN SHARE MODE');
      // Re-derived in pages, not recomputed in one statement: as if measured that way (the
      // build's own measurements vary with the server and the capture).
      await db.sql`UPDATE trellis.pipeline p SET apply_costs = '{"rederive": 0.001, "recompute": 1}'
                     FROM trellis.transforms t WHERE t.id = p.transform_id AND t.target_name = 'heavy'`;
      await db.sql`UPDATE big SET v = v + 1`;
      await waitFor(
        async () => {
          const [row] = await db.sql<{ waiting: boolean }[]>`
            SELECT EXISTS (SELECT 1 FROM pg_locks
                            WHERE relation = 'heavy'::regclass AND NOT granted) AS waiting`;
          return row?.waiting === true;
        },
        "a drain loop waiting on the heavy target's lock (one of its pages in progress)",
        60_000,
      );
      const [pages] = await db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM trellis.pages p
          JOIN trellis.transforms t ON t.id = p.transform_id WHERE t.target_name = 'heavy'`;
      // Under trigger capture the burst is one range, cut into pages. The WAL decoder
      // writes it to the ledger in batches, which ticks can split into ranges under a page
      // each, applied whole: then the work in progress is a range, not pages (the lock
      // wait above is the same either way).
      const paged = TEST_CAPTURE !== 'logical';
      if (paged) expect(pages?.n).toBeGreaterThan(1);

      // Changes to the cheap transform's source, several ticks apart: each converges
      // while the heavy pages are still in progress.
      for (let round = 1; round <= 3; round += 1) {
        await db.sql`UPDATE small SET v = v + ${round}, k = (k + ${round}) % 12 WHERE id % 3 = 0`;
        await db.sql`INSERT INTO small VALUES (${1000 + round}, ${round}, ${round})`;
        await trellis.awaitConverged(CHEAP.target, await trellis.watermarkToken(), {
          timeoutMs: 30_000,
        });
        await expectMatchesDefinition(db.sql, CHEAP);
      }
      const [still] = await db.sql<{ waiting: boolean; pages: number }[]>`
        SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'heavy'::regclass AND NOT granted) AS waiting,
               (SELECT count(*)::int FROM trellis.pages p JOIN trellis.transforms t ON t.id = p.transform_id
                 WHERE t.target_name = 'heavy') AS pages`;
      expect(still).toEqual({ waiting: true, pages: expect.any(Number) });
      if (paged) expect(still?.pages).toBeGreaterThan(0);
      expect((await trellis.status(HEAVY.target)).status).toBe('live');
    } finally {
      await holder.unsafe('COMMIT');
      await holder.end();
    }

    await trellis.awaitConverged(HEAVY.target, await trellis.watermarkToken(), {
      timeoutMs: 120_000,
    });
    await expectMatchesDefinition(db.sql, HEAVY);
    await expectMatchesDefinition(db.sql, CHEAP);

    // Drain time is recorded per transform (each loop sends what it spent at least once a
    // second, and when it goes idle); the shares of every transform add up to one.
    await waitFor(
      async () => (await trellis.status(HEAVY.target)).drain.seconds > 0,
      'drain time recorded for the heavy transform',
      30_000,
    );
    const heavy = (await trellis.status(HEAVY.target)).drain;
    const cheap = (await trellis.status(CHEAP.target)).drain;
    expect(heavy.recentSeconds).toBeGreaterThan(0);
    expect(heavy.recentSeconds).toBeLessThanOrEqual(heavy.seconds + 0.001);
    expect(cheap.seconds).toBeGreaterThan(0);
    expect(heavy.share).not.toBeNull();
    expect(cheap.share).not.toBeNull();
    expect((heavy.share ?? 0) + (cheap.share ?? 0)).toBeCloseTo(1, 2);
    // The same from SQL, for psql users.
    const [fromSql] = await db.sql<{ drain: { seconds: number; share: number } }[]>`
      SELECT trellis.status('heavy')->'drain' AS drain`;
    expect(fromSql?.drain.seconds).toBeGreaterThan(0);
  });
});
