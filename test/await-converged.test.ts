import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { MAX_WAIT_MS } from '../src/engine/watermark.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { scrape } from './support/prometheus.js';
import {
  migratedTrellis,
  quietLogger,
  rejection,
  waitFor,
  waitForStatus,
} from './support/trellis.js';

// awaitConverged is a wait, not a call stuck on the server: it lasts as long as its caller
// asks (even past the call timeout), holds no pooled connection between its checks, and
// ends at its own deadline (`timeout`) or at shutdown (`shutdown`).

let db: TestDatabase;
/** The fleet's worker: staging and two drain loops. */
let worker: Trellis;

const items: Definition = { target: 'item_sizes', from: 'items', select: 'size', implicit: 'id' };

/** Call timeout of the handles under test: every wait below outlasts it. */
const CALL_TIMEOUT_MS = 1_000;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE items (id int PRIMARY KEY, size int NOT NULL);
    INSERT INTO items SELECT g, g FROM generate_series(1, 100) g;`);
  worker = await migratedTrellis(db, { staging: true, drainThreads: 2 });
  await worker.define(transformStatement(items));
  await waitForStatus(worker, 'item_sizes', 'live');
});

afterAll(async () => {
  await worker?.shutdown();
});

/** A handle for calls only, with a short call timeout and a small pool. */
function caller(pool = { max: 2, acquireTimeoutMs: 1_000 }): Promise<Trellis> {
  return Trellis.connect({
    url: db.url,
    logger: quietLogger,
    callTimeoutMs: CALL_TIMEOUT_MS,
    pool,
  });
}

/**
 * Rounds of `trellis`'s convergence checks so far: each round is a call of its own,
 * counted in the call metrics as `awaitConverged` (src/engine/watermark.ts), as is each
 * wait when it ends.
 */
async function checkRounds(trellis: Trellis): Promise<number> {
  return (await scrape()).count('trellis_call_duration_seconds', {
    trellis_instance: trellis.instance,
    method: 'awaitConverged',
  });
}

/** Waits until a round of `trellis`'s convergence checks has run after `at` (Date.now()). */
async function checkedAfter(trellis: Trellis, at: number, what: string): Promise<void> {
  let before: number | undefined;
  await waitFor(async () => {
    const rounds = await checkRounds(trellis);
    if (Date.now() <= at) return false;
    before ??= rounds;
    return rounds > before;
  }, what);
}

/**
 * Writes, with the drain held back, and returns a token covering the write (not yet
 * applied) and what lets the drain go on. The drain is held by a lock on the target
 * (an open transaction holding ACCESS EXCLUSIVE): its page waits for it. Not by a pause:
 * a wait on a paused transform fails at once (`conflict`, tested below).
 */
async function pendingWrite(
  trellis: Trellis,
  id: number,
): Promise<{ token: string; release: () => Promise<void> }> {
  const holder = sqlClient(db.url, { max: 1 });
  await holder.unsafe('BEGIN');
  await holder.unsafe('LOCK TABLE item_sizes IN ACCESS EXCLUSIVE MODE');
  await db.sql`INSERT INTO items VALUES (${id}, ${id})`;
  let released = false;
  return {
    token: await trellis.watermarkToken(),
    release: async () => {
      if (released) return;
      released = true;
      await holder.unsafe('COMMIT');
      await holder.end({ timeout: 2 });
    },
  };
}

describe('awaitConverged', () => {
  it('waits longer than the call timeout when asked to, and resolves once the write is in', async () => {
    await using trellis = await caller();
    const { token, release } = await pendingWrite(trellis, 1001);
    const started = Date.now();
    let settled = false;
    const waited = trellis.awaitConverged('item_sizes', token, { timeoutMs: 20_000 });
    void waited.then(
      () => (settled = true),
      () => (settled = true),
    );
    // Time is what this test is about: the wait outlives the call timeout. It is still
    // checking (a round of its checks ran) after twice the call timeout, and not settled.
    await checkedAfter(trellis, started + CALL_TIMEOUT_MS * 2, 'a check past the call timeout');
    expect(settled).toBe(false);
    await release();
    await waited;
    expect(Date.now() - started).toBeGreaterThan(CALL_TIMEOUT_MS * 2);
    await expectMatchesDefinition(db.sql, items);
  });

  it('fails with timeout at the deadline the caller gave, not at the call timeout', async () => {
    await using trellis = await caller();
    const { token, release } = await pendingWrite(trellis, 1002);
    try {
      const started = Date.now();
      const error = await rejection(
        trellis.awaitConverged('item_sizes', token, { timeoutMs: 3_000 }),
      );
      const took = Date.now() - started;
      expect(error.code).toBe('timeout');
      expect(error.message).toContain('3000 ms');
      expect(took).toBeGreaterThanOrEqual(2_950);
      expect(took).toBeLessThan(6_000);
    } finally {
      await release();
    }
    await trellis.awaitConverged('item_sizes', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, items);
  });

  it('defaults to the call timeout, and refuses a timeout it cannot honour', async () => {
    await using trellis = await caller();
    const { token, release } = await pendingWrite(trellis, 1003);
    try {
      const started = Date.now();
      expect((await rejection(trellis.awaitConverged('item_sizes', token))).code).toBe('timeout');
      expect(Date.now() - started).toBeGreaterThanOrEqual(CALL_TIMEOUT_MS - 50);
      for (const timeoutMs of [-1, Number.NaN, Number.POSITIVE_INFINITY, MAX_WAIT_MS + 1]) {
        const error = await rejection(trellis.awaitConverged('item_sizes', token, { timeoutMs }));
        expect(error.code).toBe('validation');
        expect(error.message).toContain('timeoutMs');
      }
    } finally {
      await release();
    }
  });

  it('fails with not_found for a transform that does not exist, and validation for a bad token', async () => {
    await using trellis = await caller();
    const token = await trellis.watermarkToken();
    const missing = await rejection(trellis.awaitConverged('no_such', token, { timeoutMs: 5_000 }));
    expect(missing.code).toBe('not_found');
    expect(missing.message).toContain('no_such');
    const bad = await rejection(trellis.awaitConverged('item_sizes', 'nonsense'));
    expect(bad.code).toBe('validation');
  });

  it('holds no connection while it waits: many more waits than pool.max leave calls their connections', async () => {
    const app = `trellis-test-waits-${process.pid}`;
    await using trellis = await Trellis.connect({
      url: db.url,
      logger: quietLogger,
      callTimeoutMs: CALL_TIMEOUT_MS,
      applicationName: app,
      pool: { max: 2, acquireTimeoutMs: 1_000 },
    });
    const { token, release } = await pendingWrite(trellis, 1004);
    const waits = Array.from({ length: 40 }, () =>
      trellis.awaitConverged('item_sizes', token, { timeoutMs: 30_000 }),
    );
    let settled = 0;
    for (const w of waits)
      void w.then(
        () => (settled += 1),
        () => (settled += 1),
      );
    try {
      // Other calls still get a connection (within acquireTimeoutMs, or they would fail
      // with timeout), again and again while the waits go on.
      for (let i = 0; i < 20; i += 1) {
        const status = await trellis.status('item_sizes');
        expect(status.target).toBe('item_sizes');
        // Calls spread over the waits' checks on purpose (pacing, not a wait for anything).
        await new Promise((resolve) => setTimeout(resolve, 50)); // pacing of the calls
      }
      const [sessions] = await db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${app}`;
      expect(sessions!.n).toBeLessThanOrEqual(2);
      expect(settled).toBe(0);
    } finally {
      await release();
    }
    await Promise.all(waits);
    await expectMatchesDefinition(db.sql, items);
  });

  it('is cancelled by shutdown() with shutdown', async () => {
    const trellis = await caller();
    const { token, release } = await pendingWrite(trellis, 1005);
    try {
      const asked = Date.now();
      const waited = rejection(trellis.awaitConverged('item_sizes', token, { timeoutMs: 30_000 }));
      // The wait is under way: a round of checks has run since it was asked for.
      await checkedAfter(trellis, asked, 'a check of the wait');
      const started = Date.now();
      await trellis.shutdown();
      const error = await waited;
      expect(error.code).toBe('shutdown');
      expect(Date.now() - started).toBeLessThan(5_000);
      expect((await rejection(trellis.awaitConverged('item_sizes', token))).code).toBe('shutdown');
    } finally {
      await trellis.shutdown();
      await release();
    }
  });

  it('fails at once with conflict on a paused transform, and on one reading it', async () => {
    await using trellis = await caller();
    await worker.define(
      transformStatement({
        target: 'item_doubles',
        from: 'item_sizes',
        select: 'size * 2 AS d',
        implicit: 'id',
      }),
    );
    await waitForStatus(worker, 'item_doubles', 'live');
    await trellis.apply('PAUSE TRANSFORM item_sizes');
    try {
      await db.sql`INSERT INTO items VALUES (1006, 1006)`;
      const token = await trellis.watermarkToken();
      for (const target of ['item_sizes', 'item_doubles']) {
        const started = Date.now();
        const error = await rejection(trellis.awaitConverged(target, token, { timeoutMs: 20_000 }));
        expect(Date.now() - started).toBeLessThan(5_000);
        expect(error.code).toBe('conflict');
        expect(error.message).toContain('item_sizes');
        expect(error.message).toContain('paused (operator)');
        expect(error.message).toContain('RESUME TRANSFORM item_sizes');
      }
    } finally {
      await trellis.apply('RESUME TRANSFORM item_sizes');
    }
    const token = await trellis.watermarkToken();
    await trellis.awaitConverged('item_doubles', token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, items);
  });
});
