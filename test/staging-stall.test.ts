import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { STAGING_TIMINGS } from '../src/engine/staging/staging-worker.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitForStatus } from './support/trellis.js';

// Issue #24: under load (17–24 on 2 cores) the first cases of a differential run stayed
// waiting_to_backfill for about a minute with no tick while the staging worker kept
// passing. A transform waiting to be built keeps capture "pending", which brings the next
// reconcile pass back after pendingReconcileMs (200 ms); a pass that took longer than that
// left the next one already due, the worker went straight into it without waiting for
// work (`awaitWork` returned 'due'), and only a wait for work could take a tick. With no
// tick at all yet a build cannot start (it starts from one), so every pass found the build
// still waiting and due again: no tick until the load let one pass end within 200 ms.
//
// Here every pass is longer than the pending interval (it is 0), deterministically: the
// transform is defined before the staging worker's first pass, so it is pending from the
// start and no tick exists yet.

const D = {
  t_names: { target: 't_names', from: 'things', select: 'name', implicit: 'id' },
} satisfies Record<string, Definition>;

describe('a staging worker whose passes take longer than the pending reconcile interval', () => {
  let db: TestDatabase;
  let trellis: Trellis | undefined;
  const pending = STAGING_TIMINGS.pendingReconcileMs;

  beforeAll(async () => {
    db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE things (id int PRIMARY KEY, name text);
      INSERT INTO things SELECT g, 'n' || g FROM generate_series(1, 20) g;`);
    // Defined by a handle with no staging worker: it waits to be built, and no tick exists.
    const definer = await migratedTrellis(db, { staging: false, drainThreads: 0 });
    try {
      await definer.apply(transformStatement(D.t_names));
    } finally {
      await definer.shutdown();
    }
    STAGING_TIMINGS.pendingReconcileMs = 0;
  });

  afterAll(async () => {
    STAGING_TIMINGS.pendingReconcileMs = pending;
    await trellis?.shutdown();
  });

  it('still ticks, and builds the transform waiting for its first tick', async () => {
    const [before] = await db.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM trellis.ticks`;
    expect(before?.n).toBe(0);
    trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
    await waitForStatus(trellis, D.t_names.target, 'live', 20_000);
    await db.sql`UPDATE things SET name = 'changed' WHERE id = 3`;
    const token = await trellis.watermarkToken();
    await trellis.awaitConverged(D.t_names.target, token, { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, D.t_names);
  });
});
