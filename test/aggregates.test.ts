import { afterAll, describe, expect, it } from 'vitest';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import {
  killAllWorkerProcesses,
  startWorkerProcess,
  stopWorkerProcess,
} from './support/processes.js';
import { announceSeed, scaled, testSeeds, timeoutFor } from './support/seeds.js';
import { awaitConvergedWithin, migratedTrellis, waitFor } from './support/trellis.js';
import { collectPrintedEvents, type WorkEvent } from './support/work-events.js';
import { runWorkload } from './support/workload.js';
import { ORDERS_DDL, ordersWorkload } from './support/workload-orders.js';

afterAll(killAllWorkerProcesses);

/** Steps per writer (a statement or a transaction): about as long as 3.5 s of writes. */
const OPERATIONS = 180;

/** One transform of each shape issue #5 names. */
const DEFINITIONS = {
  multi_agg: {
    target: 'multi_agg',
    from: 'orders',
    select: `customer_id, sum(amount) AS total, count(*) AS n,
             avg(amount) AS mean, min(amount) AS low, max(amount) AS high`,
    groupBy: 'customer_id',
  },
  fancy_agg: {
    target: 'fancy_agg',
    from: 'orders',
    select: `status, count(DISTINCT customer_id) AS buyers,
             sum(amount) FILTER (WHERE qty > 2) AS big_total,
             string_agg(id::text, ',' ORDER BY id) AS ids,
             percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) AS median,
             product_of(1 + qty / 100.0) AS growth`,
    groupBy: 'status',
    having: 'count(*) > 3',
  },
  by_bucket: {
    target: 'by_bucket',
    from: 'orders',
    select: 'amount::int / 10 AS bucket, count(*) AS n',
    where: "status <> 'void'",
    groupBy: 'amount::int / 10',
  },
  grand_total: {
    target: 'grand_total',
    from: 'orders',
    select: 'sum(amount) AS total, count(*) AS n',
  },
  inner_join: {
    target: 'inner_join',
    from: 'orders o JOIN customers c ON c.id = o.customer_id',
    select: 'o.amount, c.name',
    where: "o.status <> 'void'",
    // The keys of both rows: orders' id, then customers' (id is taken: c_id).
    implicit: 'o.id AS id, c.id AS c_id',
  },
  left_join: {
    target: 'left_join',
    from: 'customers c LEFT JOIN orders o ON o.customer_id = c.id AND o.qty > 1',
    select: 'c.name, o.amount',
    implicit: 'c.id AS id, o.id AS o_id',
  },
  join_agg: {
    target: 'join_agg',
    from: 'orders o JOIN customers c ON c.id = o.customer_id',
    select: 'c.tier, sum(o.amount) AS total, count(*) AS n',
    groupBy: 'c.tier',
  },
  three_way: {
    target: 'three_way',
    from: `orders o JOIN customers c ON c.id = o.customer_id
           LEFT JOIN regions r ON r.code = c.region_code`,
    select: 'o.id AS order_id, c.name, r.label',
    // orders' key is selected (order_id); customers' and regions' are added.
    implicit: 'c.id AS id, r.code AS code',
  },
  region_agg: {
    target: 'region_agg',
    from: `orders o JOIN customers c ON c.id = o.customer_id
           LEFT JOIN regions r ON r.code = c.region_code`,
    select: 'r.label, count(*) AS n, sum(o.amount) AS total',
    groupBy: 'r.label',
  },
} satisfies Record<string, Definition>;

const ALL = Object.values(DEFINITIONS);

describe.each(testSeeds([101, 202]))(
  'GROUP BY and JOIN under concurrent writes (seed %i)',
  (seed) => {
    it('leaves every target equal to its definition', { timeout: timeoutFor(60_000) }, async () => {
      announceSeed('aggregates', seed, 'test/aggregates.test.ts');
      const db = await freshDatabase();
      // The second process shares the builds' chunks: a build this small is otherwise filled in
      // one statement by whichever loop claims it (ADR 0060), leaving it nothing to prove it worked.
      await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET trellis.one_statement_build_rows = 0`);
      await db.sql.unsafe(ORDERS_DDL);
      await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      // The second process must really share the work: the drain's records of its work
      // (a range or page applied, a build chunk filled) that it prints, not a sample of its sessions.
      const otherWork: WorkEvent[] = [];
      const other = await startWorkerProcess(
        db.url,
        { drainThreads: 1, staging: false, applicationName: 'second-process' },
        collectPrintedEvents(otherWork, 'second-process'),
      );
      try {
        // Its drain connected before there is work: on an idle machine this process could
        // otherwise build and drain everything while the other one is still starting.
        await waitFor(async () => {
          const [row] = await db.sql<{ n: number }[]>`
            SELECT count(*)::int AS n FROM pg_stat_activity
             WHERE datname = ${db.name} AND application_name LIKE 'second-process%'`;
          return (row?.n ?? 0) > 0;
        }, 'the second process to connect');
        for (const d of ALL) await trellis.apply(transformStatement(d));
        const truncates = seed % 2 === 0 ? 1 : 0;
        const result = await runWorkload(db.sql, ordersWorkload(), {
          seed,
          writers: 4,
          operations: scaled(OPERATIONS),
          truncates,
          longTransactions: scaled(2),
        });
        console.log(`[workload] aggregates ${seed} ${JSON.stringify(result)}`);
        expect(result.committed).toBeGreaterThan(20);
        expect(result.truncates).toBe(truncates);
        expect(result.longTransactions).toBe(scaled(2));
        expect(result.savepointsRolledBack).toBeGreaterThan(0);
        expect(result.expected.uniqueViolation).toBeGreaterThan(0);
        const token = await trellis.watermarkToken();
        for (const d of ALL) {
          await awaitConvergedWithin(trellis, d.target, token, timeoutFor(25_000, 180_000));
        }
        for (const d of ALL) {
          await expectMatchesDefinition(db.sql, d);
          expect((await trellis.status(d.target)).heldKeys).toBe(0);
        }
        expect(otherWork.length).toBeGreaterThan(0);
        expect(other.exitCode).toBeNull();
      } finally {
        await stopWorkerProcess(other);
      }
    });
  },
);

describe('GROUP BY and JOIN specifics', () => {
  it('shows a left join’s unmatched rows appear and disappear, and a grand total is one row', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(ORDERS_DDL);
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    const { left_join, grand_total } = DEFINITIONS;
    await trellis.apply(transformStatement(left_join));
    await trellis.apply(transformStatement(grand_total));
    const converge = async () => {
      const token = await trellis.watermarkToken();
      for (const d of [left_join, grand_total]) {
        await trellis.awaitConverged(d.target, token, { timeoutMs: 20_000 });
        await expectMatchesDefinition(db.sql, d);
      }
    };
    await converge();
    await db.sql`INSERT INTO customers VALUES (9000, 'lonely', NULL, 1)`;
    await converge();
    let rows = await db.sql`SELECT amount FROM left_join WHERE name = 'lonely'`;
    expect(rows.map((r) => r.amount)).toEqual([null]);
    await db.sql`INSERT INTO orders VALUES (90000, 9000, 12, 'open', 3)`;
    await converge();
    rows = await db.sql`SELECT amount FROM left_join WHERE name = 'lonely'`;
    expect(rows.map((r) => r.amount)).toEqual(['12']);
    await db.sql`DELETE FROM orders WHERE id = 90000`;
    await converge();
    rows = await db.sql`SELECT amount FROM left_join WHERE name = 'lonely'`;
    expect(rows.map((r) => r.amount)).toEqual([null]);
    expect(await db.sql`SELECT count(*)::int AS n FROM grand_total`).toEqual([{ n: 1 }]);
    await db.sql`DELETE FROM orders`;
    await converge();
    expect(await db.sql`SELECT total, n::int FROM grand_total`).toEqual([{ total: null, n: 0 }]);
  });
});

describe('source index gaps', () => {
  it('reports each index a GROUP BY or JOIN needs and lacks, by role, with its fix', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(`
      CREATE TABLE customers (id int PRIMARY KEY, name text, tier int);
      CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text, amount numeric);`);
    await using trellis = await migratedTrellis(db);
    await trellis.apply(
      'TRANSFORM by_status FROM orders SELECT status, count(*) AS n GROUP BY status',
    );
    await trellis.apply(
      'TRANSFORM order_names FROM orders o JOIN customers c ON c.id = o.customer_id SELECT o.amount, c.name',
    );
    await trellis.apply(
      'TRANSFORM customer_orders FROM customers c LEFT JOIN orders o ON o.customer_id = c.id SELECT c.name, o.amount WITHOUT SOURCE INDEX',
    );
    await trellis.apply('TRANSFORM plain FROM orders SELECT amount');

    expect((await trellis.status('by_status')).sourceIndexGaps).toEqual([
      {
        table: 'public.orders',
        columns: ['status'],
        role: 'group_by',
        optedOut: false,
        fix: 'CREATE INDEX CONCURRENTLY ON public.orders (status)',
        fixInMigration: 'CREATE INDEX ON public.orders (status)',
      },
    ]);
    // orders is the FROM side of the join; customers.id is its primary key (no gap).
    expect((await trellis.status('order_names')).sourceIndexGaps).toEqual([
      {
        table: 'public.orders',
        columns: ['customer_id'],
        role: 'join_from',
        optedOut: false,
        fix: 'CREATE INDEX CONCURRENTLY ON public.orders (customer_id)',
        fixInMigration: 'CREATE INDEX ON public.orders (customer_id)',
      },
    ]);
    // orders is the joined side here; the transform opted out.
    expect((await trellis.status('customer_orders')).sourceIndexGaps).toEqual([
      {
        table: 'public.orders',
        columns: ['customer_id'],
        role: 'join_joined',
        optedOut: true,
        fix: 'CREATE INDEX CONCURRENTLY ON public.orders (customer_id)',
        fixInMigration: 'CREATE INDEX ON public.orders (customer_id)',
      },
    ]);
    expect((await trellis.status('plain')).sourceIndexGaps).toEqual([]);

    await trellis.apply('ALTER TRANSFORM customer_orders RESET WITHOUT SOURCE INDEX');
    expect((await trellis.status('customer_orders')).sourceIndexGaps[0]?.optedOut).toBe(false);

    // Running the fix closes the gap, for every transform that had it.
    await db.sql.unsafe((await trellis.status('order_names')).sourceIndexGaps[0]!.fix);
    expect((await trellis.status('order_names')).sourceIndexGaps).toEqual([]);
    expect((await trellis.status('customer_orders')).sourceIndexGaps).toEqual([]);
    await db.sql.unsafe((await trellis.status('by_status')).sourceIndexGaps[0]!.fix);
    expect((await trellis.status('by_status')).sourceIndexGaps).toEqual([]);
    // Trellis itself never created an index on a user table.
    const [row] =
      await db.sql`SELECT count(*)::int AS n FROM pg_indexes WHERE tablename IN ('orders', 'customers')`;
    expect(row?.n).toBe(4);
  });
});
