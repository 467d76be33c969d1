// Builds filled by several drain loops at once (issue #14, ADR 0028): chunks of one build
// claimed by loops in two processes, a failing row held without stopping the build, and a
// process killed in the middle of filling a chunk.
import { afterAll, describe, expect, it } from 'vitest';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { killAllWorkerProcesses, killHard, startWorkerProcess } from './support/processes.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';
import {
  collectPrintedEvents,
  mostAtOnce,
  type WorkEvent,
  workEventLogger,
} from './support/work-events.js';
import { ACCOUNTS_DDL, seedAccounts } from './support/workload-accounts.js';

afterAll(killAllWorkerProcesses);

/** Several chunks of 50,000 driving rows each. */
const ROWS = 260_000;

const PROJECTION: Definition = {
  target: 'acct_owners',
  from: 'accounts',
  select: 'owner, balance * 2 AS doubled',
  implicit: 'id',
};
/** A join with a WHERE: its key map is filled chunk by chunk beside the target. */
const JOINED: Definition = {
  target: 'acct_cities',
  from: 'accounts a JOIN branches b ON b.id = a.branch_id',
  select: 'a.owner, b.city',
  where: "a.status = 'active'",
  // Both keys: accounts' id, and branches' id under its alias (id is taken).
  implicit: 'a.id AS id, b.id AS b_id',
};

describe('builds filled by several drain loops', { timeout: 180_000 }, () => {
  it('fills the chunks of one build in two processes at once, and the targets equal their definitions', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(ROWS));
    await db.sql.unsafe('ANALYZE accounts');
    // The fills each process's drain loops record, with when they ran (server clock).
    const events: WorkEvent[] = [];
    const other = await startWorkerProcess(
      db.url,
      { drainThreads: 2, staging: false },
      collectPrintedEvents(events, 'other'),
    );
    await using trellis = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      logger: workEventLogger(events),
    });
    try {
      await trellis.apply(transformStatement(PROJECTION));
      await trellis.apply(transformStatement(JOINED));
      // Writes while the builds run reach the targets through the ledger.
      await db.sql`UPDATE accounts SET balance = balance + 3 WHERE id % 997 = 0`;
      await db.sql`DELETE FROM accounts WHERE id % 1009 = 0`;
      await waitForStatus(trellis, PROJECTION.target, 'live', 120_000);
      await waitForStatus(trellis, JOINED.target, 'live', 120_000);
      // Chunks of the one build were filled side by side, by both processes.
      const fills = events.filter(
        (e) => e.msg === 'a build chunk filled' && e.target === PROJECTION.target,
      );
      expect(mostAtOnce(fills)).toBeGreaterThanOrEqual(2);
      expect(new Set(fills.map((e) => e.process))).toEqual(new Set(['test', 'other']));
      const status = await trellis.status(PROJECTION.target);
      // Progress ends at the driving rows there were when the build started.
      expect(status.backfill?.keysDone).toBe(status.backfill?.keysTotal);
      expect(status.backfill?.keysTotal).toBeGreaterThan(ROWS - 300);
      const token = await trellis.watermarkToken();
      for (const d of [PROJECTION, JOINED]) {
        await trellis.awaitConverged(d.target, token, { timeoutMs: 30_000 });
        await expectMatchesDefinition(db.sql, d);
      }
    } finally {
      await killHard(other);
    }
  });

  it('holds a failing row of one chunk while the other chunks fill, and releases it once fixed', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE ratios_src (id int PRIMARY KEY, a int NOT NULL, b int NOT NULL);
      INSERT INTO ratios_src SELECT g, g, 1 + g % 5 FROM generate_series(1, ${ROWS}) g;
      UPDATE ratios_src SET b = 0 WHERE id IN (7, 120001, 250000);
      ANALYZE ratios_src;`);
    const ratios: Definition = {
      target: 'ratios',
      from: 'ratios_src',
      select: 'a / b AS ratio, a',
      implicit: 'id',
    };
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 3 });
    await trellis.apply(transformStatement(ratios));
    await waitForStatus(trellis, ratios.target, 'live', 120_000);
    // Every row is there; the three failing ones without the column that fails.
    const status = await trellis.status(ratios.target);
    expect(status.heldKeys).toBe(3);
    const [counts] = await db.sql<{ rows: number; held: number }[]>`
      SELECT count(*)::int AS rows, count(*) FILTER (WHERE ratio IS NULL)::int AS held FROM ratios`;
    expect(counts).toEqual({ rows: ROWS, held: 3 });
    const sample = await trellis.sampleQuarantined('ratios.ratio', { limit: 10 });
    expect(sample.samples.map((s) => s.key).sort()).toEqual(['120001', '250000', '7']);
    // Fixed and resumed: the held keys are re-derived, and the target is its definition.
    await db.sql`UPDATE ratios_src SET b = 2 WHERE b = 0`;
    await trellis.apply('RESUME TRANSFORM ratios');
    await trellis.awaitConverged(ratios.target, await trellis.watermarkToken(), {
      timeoutMs: 30_000,
    });
    expect((await trellis.status(ratios.target)).heldKeys).toBe(0);
    await expectMatchesDefinition(db.sql, ratios);
  });

  it('loses nothing when a process filling chunks is killed -9 while others fill the same build', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(ROWS));
    await db.sql.unsafe('ANALYZE accounts');
    const api = await migratedTrellis(db);
    try {
      const doomed = await startWorkerProcess(db.url, {
        drainThreads: 2,
        staging: true,
        applicationName: 'doomed',
      });
      await api.apply(transformStatement(PROJECTION));
      await waitFor(
        async () => {
          const [row] = await db.sql<{ n: number }[]>`
            SELECT count(*)::int AS n FROM pg_stat_activity
             WHERE application_name = 'doomed:worker' AND state = 'active'
               AND query LIKE ${`INSERT INTO %${PROJECTION.target} (%`}`;
          return (row?.n ?? 0) > 0;
        },
        'a chunk being filled by the doomed process',
        60_000,
      );
      await using successor = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      await killHard(doomed);
      await db.sql`UPDATE accounts SET balance = balance + 7 WHERE id % 1000 = 0`;
      await waitForStatus(successor, PROJECTION.target, 'live', 120_000);
      await successor.awaitConverged(PROJECTION.target, await successor.watermarkToken(), {
        timeoutMs: 30_000,
      });
      // Its key back (the oracle checks it), and every row once.
      await expectMatchesDefinition(db.sql, PROJECTION);
    } finally {
      await api.shutdown();
    }
  });

  it('starts over a build an older version was filling chunk by chunk, and the target equals its definition', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(20_000));
    // A staging worker and no drain loop: the build starts and nothing fills it.
    await using staging = await migratedTrellis(db, { staging: true });
    await staging.apply(transformStatement(PROJECTION));
    await waitForStatus(staging, PROJECTION.target, 'backfilling', 30_000);
    // As an older version left it: the key dropped until the end, the first chunk filled,
    // its position recorded.
    await db.sql.begin(async (tx) => {
      await tx`SELECT set_config('trellis.maintaining', 'trellis', true)`;
      await tx.unsafe(`ALTER TABLE ${PROJECTION.target} DROP CONSTRAINT ${PROJECTION.target}_pkey`);
      await tx`UPDATE trellis.pipeline SET deferred_ddl = ${[
        `ALTER TABLE public.${PROJECTION.target} ADD CONSTRAINT ${PROJECTION.target}_pkey PRIMARY KEY (id)`,
      ]}`;
      await tx.unsafe(
        `INSERT INTO ${PROJECTION.target} (owner, doubled, id)
         SELECT owner, balance * 2, id FROM accounts WHERE id <= 5000`,
      );
      await tx`UPDATE trellis.pipeline SET backfill_position = '{5000}', backfill_done = 5000`;
    });
    await using drain = await migratedTrellis(db, { drainThreads: 2 });
    await waitForStatus(drain, PROJECTION.target, 'live', 60_000);
    await expectMatchesDefinition(db.sql, PROJECTION);
  });
});
