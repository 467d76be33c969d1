import { describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { freshDatabase } from './support/database.js';
import {
  type Definition,
  expectMatchesDefinition,
  linkChains,
  transformStatement,
} from './support/oracle.js';
import { announceSeed, testSeeds } from './support/seeds.js';
import { awaitConvergedWithin, migratedTrellis, quietLogger, waitFor } from './support/trellis.js';
import { runWorkload } from './support/workload.js';
import { ACCOUNTS_DDL, accountsWorkload, seedAccounts } from './support/workload-accounts.js';

// Switching a live instance between trigger and WAL capture (ADR 0023) under concurrent
// writes loses no change: every target equals its definition (the oracle) after the
// instance went from triggers to the slot and back, while writers never stopped.

// Chains (a FROM naming another's target) are recomputed from the base tables.
const DEFINITIONS: Definition[] = linkChains([
  { target: 'acct_all', from: 'accounts', select: 'owner, balance', implicit: 'id' },
  {
    target: 'acct_active',
    from: 'accounts a',
    select: 'a.owner, a.balance * 2 AS doubled',
    where: "a.status = 'active' AND a.balance > 10",
    implicit: 'a.id AS id',
  },
  {
    target: 'acct_rich',
    from: 'acct_active',
    select: 'upper(owner) AS owner, doubled',
    where: 'doubled > 900',
    implicit: 'id',
  },
  {
    target: 'acct_by_owner',
    from: 'accounts',
    select: 'owner, count(*) AS n, sum(balance) AS total',
    groupBy: 'owner',
  },
  {
    target: 'acct_branch',
    from: 'accounts a JOIN branches b ON b.id = a.branch_id',
    select: 'a.owner, a.balance, b.city',
    implicit: 'a.id AS id, b.id AS b_id',
  },
]);

type Mode = 'trigger' | 'logical';

describe.each(testSeeds([41]))('switching capture under concurrent writes (seed %i)', (seed) => {
  it('trigger → WAL → trigger loses no change', { timeout: 240_000 }, async () => {
    announceSeed('capture switch', seed, 'test/capture-switch.test.ts');
    const db = await freshDatabase();
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(5_000));
    await using trellis = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      capture: 'trigger',
    });
    for (const d of DEFINITIONS) await trellis.apply(transformStatement(d));
    const token0 = await trellis.watermarkToken();
    for (const d of DEFINITIONS) await awaitConvergedWithin(trellis, d.target, token0, 60_000);

    const record = async (mode: Mode) => {
      const handle = await Trellis.connect({ url: db.url, logger: quietLogger, capture: mode });
      await handle.shutdown();
    };
    /** Every source captured the one way, and only that way. */
    const capturedBy = async (mode: Mode) => {
      const [row] = await db.sql<{ done: boolean }[]>`
        SELECT bool_and(CASE WHEN ${mode} = 'logical'
                             THEN wal_state = 'ready' AND installed_at IS NULL
                             ELSE wal_state IS NULL AND installed_at IS NOT NULL END) AS done
          FROM trellis.sources`;
      return row?.done === true;
    };

    let steps = 0;
    const at: Record<string, number> = {};
    const operations = 240;
    const writers = 4;
    const total = operations * writers;
    // Writers pause twice, so that each switch sees writes while it runs and after it:
    // before 45% of their steps until the instance is on the slot alone, before 90% until
    // it is back on triggers.
    const gate = () => {
      let open: () => void = () => undefined;
      const opened = new Promise<void>((resolve) => {
        open = resolve;
      });
      return { open, opened };
    };
    const onSlot = gate();
    const onTriggers = gate();
    const switching = (async () => {
      try {
        await waitFor(async () => steps >= total * 0.2, 'a fifth of the writes', 120_000);
        at.toLogical = steps;
        await record('logical');
        await waitFor(() => capturedBy('logical'), 'every source on WAL capture alone', 120_000);
        at.logical = steps;
        onSlot.open();
        await waitFor(async () => steps >= total * 0.55, 'writes under WAL capture', 120_000);
        at.toTrigger = steps;
        await record('trigger');
        await waitFor(() => capturedBy('trigger'), 'every source back on triggers', 120_000);
        at.trigger = steps;
      } finally {
        onSlot.open();
        onTriggers.open();
      }
    })();
    const result = await runWorkload(db.sql, accountsWorkload(5_000), {
      seed,
      writers,
      operations,
      longTransactions: 2,
      holdAt: [
        { step: Math.floor(operations * 0.45), until: onSlot.opened },
        { step: Math.floor(operations * 0.9), until: onTriggers.opened },
      ],
      onStep: () => {
        steps += 1;
      },
    });
    await switching;
    console.log(`[workload] capture switch ${seed} ${JSON.stringify({ at, result })}`);
    // Writes came while the instance moved to the slot, under the slot alone, while it
    // moved back, and after.
    expect(at.logical!).toBeGreaterThan(at.toLogical!);
    expect(at.toTrigger!).toBeGreaterThan(at.logical!);
    expect(at.trigger!).toBeGreaterThan(at.toTrigger!);
    expect(total).toBeGreaterThan(at.trigger!);

    const token = await trellis.watermarkToken();
    for (const d of DEFINITIONS) await awaitConvergedWithin(trellis, d.target, token, 90_000);
    for (const d of DEFINITIONS) await expectMatchesDefinition(db.sql, d);
    // Back on triggers with everything decoded, the slot goes.
    await waitFor(
      async () => {
        const [row] = await db.sql<{ n: number }[]>`
          SELECT count(*)::int AS n FROM pg_replication_slots WHERE database = current_database()`;
        return row?.n === 0;
      },
      'the slot to be dropped',
      30_000,
    );
  });
});
