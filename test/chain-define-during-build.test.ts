// A transform defined over another's target while that target's build starts: the build
// drops its target's key to fill it faster unless another transform reads the target, and
// a define in a transaction not yet committed must not be missed by that check (a
// differential run found the chain paused: "source table … has no primary key any more").
import { describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { quietLogger } from './support/recent-logs.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

const UP: Definition = {
  target: 'cd_up',
  from: 'cd_items',
  select: 'g, v * 2 AS v2',
  implicit: 'id',
};
const DOWN: Definition = {
  target: 'cd_down',
  from: 'cd_up',
  select: 'g, sum(v2) AS total, count(*) AS n',
  groupBy: 'g',
  reads: [UP],
};

describe('a transform defined over a target whose build is starting', { timeout: 120_000 }, () => {
  it('keeps the target its key, and both become live equal to their definitions', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE cd_items (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL);
      INSERT INTO cd_items SELECT i, i % 10, i FROM generate_series(1, 2000) i;`);
    // Defined with no worker running: its build has not started.
    await using definer = await migratedTrellis(db, { staging: false, drainThreads: 0 });
    await definer.apply(transformStatement(UP));

    // A migration defines the chain over it, and is still open when the build starts.
    let commit!: () => void;
    const committed = new Promise<void>((resolve) => {
      commit = resolve;
    });
    const migration = db.sql.begin(async (tx) => {
      await tx.unsafe(`SELECT trellis.apply($1)`, [transformStatement(DOWN)]);
      await committed;
    });
    await waitFor(
      async () =>
        (
          await db.sql`SELECT 1 FROM pg_stat_activity
                        WHERE datname = current_database() AND state = 'idle in transaction'
                          AND query LIKE '%trellis.apply%'`
        ).length > 0,
      'the migration to define the chain',
    );
    await using workers = await Trellis.connect({
      url: db.url,
      logger: quietLogger,
      staging: true,
      drainThreads: 2,
    });
    // The build reaches the target's key, and waits for the migration (its lock on the
    // target) before it decides.
    await waitFor(
      async () =>
        (
          await db.sql`SELECT 1 FROM pg_locks
                        WHERE relation = 'cd_up'::regclass AND NOT granted`
        ).length > 0,
      "the build to wait for the migration's lock on cd_up",
      60_000,
    );
    commit();
    await migration;

    await waitForStatus(workers, UP.target, 'live', 60_000);
    const down = await waitForStatus(workers, DOWN.target, 'live', 60_000);
    expect(down.captureFailure).toBeNull();
    const [key] = await db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_index WHERE indrelid = 'cd_up'::regclass AND indisprimary`;
    expect(key?.n).toBe(1);
    await db.sql`UPDATE cd_items SET v = v + 1 WHERE id % 7 = 0`;
    await db.sql`DELETE FROM cd_items WHERE id % 11 = 0`;
    await workers.awaitConverged(DOWN.target, await workers.watermarkToken(), {
      timeoutMs: 60_000,
    });
    await expectMatchesDefinition(db.sql, UP);
    await expectMatchesDefinition(db.sql, DOWN);
  });
});
