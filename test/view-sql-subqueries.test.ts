import { describe, expect, it } from 'vitest';
import { TrellisError } from '../src/engine/index.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { waitFor, waitForStatus } from './support/trellis.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// Subqueries in FROM and WITH in a view's SQL (issue #26, ADR 0056): each derived table and
// WITH query is a hidden part (a chained transform), and the statement around it reads its
// target. Each target is compared with the statement as written, recomputed by Postgres
// (the oracle), after inserts, updates of keys, groups and join columns, deletes, NULLs and
// duplicates on every source.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE customer (c_custkey int PRIMARY KEY, c_name text);
      CREATE TABLE orders (o_orderkey int PRIMARY KEY, o_custkey int, o_comment text);
      INSERT INTO customer SELECT k, 'Customer#' || k FROM generate_series(1, 12) k;
      INSERT INTO orders SELECT k, 1 + k % 9,
        CASE WHEN k % 7 = 0 THEN 'a special deposit requests note' WHEN k % 11 = 0 THEN NULL
             ELSE 'regular order ' || k END
        FROM generate_series(1, 60) k;
      CREATE TABLE shop_customers (id int PRIMARY KEY, name text, tier text);
      CREATE TABLE shop_orders (id int PRIMARY KEY, customer_id int NOT NULL, amount numeric, status text);
      INSERT INTO shop_customers VALUES (1, 'ann', 'gold'), (2, 'bob', 'silver'), (3, 'cy', NULL),
        (4, 'di', 'gold'), (5, NULL, 'bronze');
      INSERT INTO shop_orders VALUES (1, 1, 10.5, 'paid'), (2, 1, 3, 'open'), (3, 2, 7, 'paid'),
        (4, 3, NULL, NULL), (5, 2, 7, 'paid'), (6, 4, 2, 'void'), (7, 4, 20, 'paid'),
        (8, 99, 5, 'paid'), (9, 2, 7, 'paid');`);
  },
});

// TPC-H Q13 as the specification writes it (its parameters substituted).
const q13: Definition = {
  form: 'as',
  target: 'q13',
  select: 'c_count, count(*) AS custdist',
  from: `(SELECT c_custkey, count(o_orderkey) FROM customer LEFT OUTER JOIN orders
           ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
         GROUP BY c_custkey) AS c_orders (c_custkey, c_count)`,
  groupBy: 'c_count',
  orderBy: 'custdist DESC, c_count DESC',
};

// Two WITH queries, the second reading the first, and the first read again by the SELECT:
// one part each.
const twoCtes: Definition = {
  form: 'as',
  target: 'big_spenders',
  with: `per_customer AS (SELECT customer_id, sum(amount) AS total, count(*) AS n
                            FROM shop_orders WHERE status IS DISTINCT FROM 'void'
                           GROUP BY customer_id),
         big (cid, spent) AS (SELECT customer_id, total FROM per_customer WHERE total > 10)`,
  select: 'c.name, c.tier, b.spent, p.n',
  from: `shop_customers c JOIN big b ON b.cid = c.id JOIN per_customer p ON p.customer_id = c.id`,
  implicit: 'c.id AS id, b.cid AS cid, p.customer_id AS customer_id',
};

// A derived table joined with a base table, on either side of a LEFT JOIN.
const derivedJoined: Definition = {
  form: 'as',
  target: 'customer_totals',
  select: 'c.name, t.total, t.orders',
  from: `shop_customers c LEFT JOIN (SELECT customer_id, sum(amount) AS total, count(*) orders
                                        FROM shop_orders GROUP BY customer_id) t
           ON t.customer_id = c.id`,
  implicit: 'c.id AS id, t.customer_id AS customer_id',
};

// Aggregates over aggregates: the distribution of customers by their order count, and a
// grand total over the groups.
const overAggregates: Definition = {
  form: 'as',
  target: 'order_count_spread',
  select: 'per.n, count(*) AS customers, sum(per.total) AS amount, max(per.top) AS top',
  from: `(SELECT customer_id, count(*) AS n, sum(amount) AS total, max(amount) AS top
            FROM shop_orders GROUP BY customer_id) AS per`,
  groupBy: 'per.n',
};
const grandOverGroups: Definition = {
  form: 'as',
  target: 'buyers_summary',
  select:
    'count(*) AS buyers, sum(per.total) AS amount, max(per.n) AS most, min(d.customer_id) AS first',
  from: `(SELECT DISTINCT customer_id FROM shop_orders WHERE status IS NOT NULL) AS d
           JOIN (SELECT customer_id, count(*) AS n, sum(amount) AS total FROM shop_orders
                  GROUP BY customer_id) per ON per.customer_id = d.customer_id`,
};

// A projection subquery without its source's key: the part carries it (a hidden key), and
// the rows it holds twice (duplicates) count twice.
const projectionCounted: Definition = {
  form: 'as',
  target: 'status_amounts',
  select: "coalesce(s.status, 'none') AS status, count(*) AS n, sum(s.amount) AS amount",
  from: '(SELECT amount, status FROM shop_orders WHERE amount IS DISTINCT FROM 0) s',
  groupBy: "coalesce(s.status, 'none')",
};

// Nesting: a derived table reading a WITH query of the statement around it (and carrying
// the key of the table it joins, which it does not select), and three levels of aggregation.
const nestedScope: Definition = {
  form: 'as',
  target: 'nested_scope',
  with: 'per AS (SELECT customer_id, count(*) AS n FROM shop_orders GROUP BY customer_id)',
  select: 'x.n, count(*) AS k, count(x.tier) AS tiered',
  from: '(SELECT p.n, c.tier FROM per p JOIN shop_customers c ON c.id = p.customer_id) x',
  groupBy: 'x.n',
};
const threeLevels: Definition = {
  form: 'as',
  target: 'three_levels',
  select: 'z.m, count(*) AS spread',
  from: `(SELECT y.n, count(*) AS m
            FROM (SELECT customer_id, count(*) AS n FROM shop_orders GROUP BY customer_id) y
           GROUP BY y.n) z`,
  groupBy: 'z.m',
};

const all = [
  q13,
  twoCtes,
  derivedJoined,
  overAggregates,
  grandOverGroups,
  projectionCounted,
  nestedScope,
  threeLevels,
];

/** The writes of each step, every one followed by a comparison with the oracle. */
const steps: string[] = [
  // Q13's sources: customers with no order appear at count 0; keys, join columns and the
  // filtered comment move; NULLs.
  `INSERT INTO customer VALUES (13, 'Customer#13'), (14, NULL);
   INSERT INTO orders VALUES (61, 13, 'plain'), (62, 13, 'special requests'), (63, NULL, 'x');`,
  `UPDATE orders SET o_custkey = 14 WHERE o_orderkey IN (1, 2, 61);
   UPDATE orders SET o_comment = 'special requests here' WHERE o_orderkey = 3;
   UPDATE orders SET o_comment = NULL WHERE o_orderkey = 4;
   UPDATE orders SET o_comment = 'fine now' WHERE o_orderkey = 7;
   UPDATE orders SET o_orderkey = 100 WHERE o_orderkey = 5;`,
  `UPDATE customer SET c_custkey = 20 WHERE c_custkey = 2;
   DELETE FROM customer WHERE c_custkey = 3;
   DELETE FROM orders WHERE o_custkey = 4;
   UPDATE orders SET o_custkey = NULL WHERE o_orderkey = 6;`,
  // The shop's sources: groups change, a customer's key moves, rows come and go, NULLs,
  // duplicate rows of a projection.
  `INSERT INTO shop_orders VALUES (10, 5, 12, 'paid'), (11, 5, 12, 'paid'), (12, 3, 0, 'open');
   UPDATE shop_orders SET customer_id = 2 WHERE id = 1;
   UPDATE shop_orders SET amount = 30 WHERE id = 2;
   UPDATE shop_orders SET status = 'void' WHERE id = 7;`,
  `UPDATE shop_orders SET id = 20 WHERE id = 3;
   UPDATE shop_orders SET status = NULL, amount = NULL WHERE id = 5;
   DELETE FROM shop_orders WHERE id = 9;
   UPDATE shop_customers SET id = 6 WHERE id = 1;
   UPDATE shop_customers SET tier = 'gold', name = 'cy' WHERE id = 3;
   INSERT INTO shop_customers VALUES (99, 'eve', NULL), (7, 'ann', 'gold');`,
  `DELETE FROM shop_customers WHERE id = 4;
   UPDATE shop_customers SET tier = NULL WHERE id = 2;
   UPDATE shop_orders SET customer_id = 6 WHERE customer_id = 99;
   DELETE FROM shop_orders WHERE customer_id = 5;
   INSERT INTO shop_orders VALUES (13, 7, 1, NULL), (14, 7, 1, NULL);`,
];

describe('subqueries in FROM and WITH', () => {
  it('maintains them through every kind of write on every source, compared with the statement as written', async () => {
    await live.define(...all);
    await live.converged(all);
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await live.converged(all);
    }
  }, 240_000);

  it('shows one transform: the statement as written, its parts under it', async () => {
    const defs = await live.trellis.definitions();
    expect(defs.map((d) => d.target).filter((t) => t.startsWith('trellis#'))).toEqual([]);
    const q = defs.find((d) => d.target === 'q13');
    expect(q?.statement).toBe(
      "TRANSFORM q13 AS SELECT c_count AS c_count, count(*) AS custdist FROM (SELECT c_custkey, count(o_orderkey) FROM customer LEFT JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%' GROUP BY c_custkey) AS c_orders (c_custkey, c_count) GROUP BY c_count",
    );
    expect(q?.parts).toEqual([
      expect.objectContaining({
        name: 'c_orders',
        target: 'trellis#q13#c_orders',
        key: ['c_custkey'],
      }),
    ]);
    // The part's own source index gaps: orders is found by o_custkey, which has no index.
    expect(q?.parts?.[0]?.sourceIndexGaps).toEqual([
      expect.objectContaining({ table: 'public.orders', columns: ['o_custkey'], optedOut: false }),
    ]);
    const ctes = defs.find((d) => d.target === 'big_spenders');
    expect(ctes?.statement).toMatch(
      /^TRANSFORM big_spenders AS WITH per_customer AS \(SELECT customer_id, .*\), big \(cid, spent\) AS \(SELECT customer_id, total FROM per_customer WHERE total > 10\) SELECT c\.name AS name, .* FROM public\.shop_customers AS c JOIN big AS b ON b\.cid = c\.id JOIN per_customer AS p ON /,
    );
    expect(ctes?.parts?.map((p) => p.name)).toEqual(['per_customer', 'big']);
    // The statement as recorded defines the same transform again.
    await live.trellis.apply('DROP TRANSFORM big_spenders');
    await live.trellis.apply(ctes!.statement);
    const again = (await live.trellis.definitions()).find((d) => d.target === 'big_spenders');
    expect(again?.statement).toBe(ctes?.statement);
    await live.converged(twoCtes);
  });

  it('is not live while a part is paused or building', async () => {
    await live.trellis.apply('PAUSE TRANSFORM "trellis#q13#c_orders"');
    expect((await live.trellis.status('q13')).status).not.toBe('live');
    await live.trellis.apply('RESUME TRANSFORM "trellis#q13#c_orders"');
    await live.converged(q13);
    expect((await live.trellis.status('q13')).status).toBe('live');
  });

  it('alters the statement around its parts (ADD and DROP COLUMN), keeping them', async () => {
    await live.trellis.apply('ALTER TRANSFORM q13 ADD COLUMN max(c_orders.c_custkey) AS top_key');
    const altered: Definition = {
      ...q13,
      select: `${q13.select}, max(c_orders.c_custkey) AS top_key`,
    };
    await live.db.sql.unsafe(`INSERT INTO orders VALUES (200, 13, 'late'), (201, 12, NULL)`);
    await live.converged(altered);
    const q = (await live.trellis.definitions()).find((d) => d.target === 'q13');
    expect(q?.statement).toContain('max(c_orders.c_custkey) AS top_key FROM (SELECT c_custkey,');
    expect(q?.parts?.map((p) => p.target)).toEqual(['trellis#q13#c_orders']);
    await live.trellis.apply('ALTER TRANSFORM q13 DROP COLUMN top_key');
    await live.converged(q13);
  });

  // Redefinitions to and from statements with parts: test/redefine-parts.test.ts.
  // (and to or from statements with UNION [ALL]).
  it('refuses to redefine a part in place, changing nothing', async () => {
    const before = (await live.trellis.definitions()).find((d) => d.target === 'q13');
    const refused = await live.trellis
      .apply(
        'ALTER TRANSFORM "trellis#q13#c_orders" AS SELECT c_custkey, count(*) AS c_count FROM customer GROUP BY c_custkey',
      )
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(TrellisError);
    expect((refused as TrellisError).message).toMatch(/part of transform q13/);
    expect((await live.trellis.definitions()).find((d) => d.target === 'q13')).toEqual(before);
    await live.converged(q13);
  });

  it('defines the parts again from a dump, whose tables of their names it builds again', async () => {
    const [dumped] = await live.db.sql<{ statement: string; search_path: string }[]>`
      SELECT statement, search_path FROM trellis.transforms WHERE target_name = 'q13'`;
    await live.trellis.apply('DROP TRANSFORM q13');
    // What a schema-only dump loads before its definitions: the targets, parts' included.
    await live.db.sql.unsafe(`
      CREATE TABLE q13 (c_count bigint, custdist bigint);
      CREATE TABLE "trellis#q13#c_orders" (c_custkey int PRIMARY KEY, c_count bigint);`);
    await live.db
      .sql`SELECT trellis.restore_definition(${dumped!.statement}, ${dumped!.search_path})`;
    await live.trellis.awaitConverged('q13', await live.trellis.watermarkToken(), {
      timeoutMs: 25_000,
    });
    await live.converged(q13);
    const q = (await live.trellis.definitions()).find((d) => d.target === 'q13');
    expect(q?.statement).toBe(dumped!.statement);
    expect(q?.parts?.map((p) => p.target)).toEqual(['trellis#q13#c_orders']);
  });

  it('follows a source renamed under a part: the statement shows it, and defines the same again', async () => {
    await live.db.sql.unsafe('ALTER TABLE customer RENAME TO customer_renamed');
    const statement = async () =>
      (await live.trellis.definitions()).find((d) => d.target === 'q13')?.statement ?? '';
    await waitFor(
      async () => (await statement()).includes('customer_renamed'),
      'the rename in the statement',
    );
    const renamed: Definition = {
      ...q13,
      from: q13.from.replace('FROM customer ', 'FROM customer_renamed '),
    };
    await live.db.sql.unsafe(`INSERT INTO customer_renamed VALUES (30, 'x'), (31, NULL)`);
    await live.converged(renamed);
    const shown = await statement();
    await live.trellis.apply('DROP TRANSFORM q13');
    await live.trellis.apply(shown);
    await waitForStatus(live.trellis, 'q13', 'live');
    await live.converged(renamed);
    expect(await statement()).toBe(shown);
  });

  it('drops the parts with the transform, and a part only with it', async () => {
    const refused = await live.trellis
      .apply('DROP TRANSFORM "trellis#big_spenders#big"')
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(TrellisError);
    expect((refused as TrellisError).message).toContain('part of transform big_spenders');
    for (const d of all) await live.trellis.apply(`DROP TRANSFORM ${d.target}`);
    const left = await live.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_class WHERE relname LIKE 'trellis#%'`;
    expect(left[0]?.n).toBe(0);
    expect(await live.trellis.definitions()).toEqual([]);
  });

  const refusedStatements: Array<[string, string]> = [
    [
      'WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x) SELECT n FROM x',
      'a recursive WITH clause',
    ],
    [
      'SELECT c.name, l.n FROM shop_customers c JOIN LATERAL (SELECT count(*) AS n FROM shop_orders o WHERE o.customer_id = c.id) l ON true',
      'LATERAL',
    ],
    [
      'SELECT c.name, l.n FROM shop_customers c JOIN (SELECT customer_id, count(*) AS n FROM shop_orders o WHERE o.customer_id = c.id GROUP BY customer_id) l ON l.customer_id = c.id',
      'invalid reference to FROM-clause entry for table "c"',
    ],
    [
      // An IN is a semi-join (ADR 0057), but not inside another expression.
      'WITH r AS (SELECT customer_id, sum(amount) AS total FROM shop_orders GROUP BY customer_id) SELECT customer_id, total FROM r WHERE NOT (customer_id IN (SELECT id FROM shop_customers))',
      'a subquery in WHERE',
    ],
    [
      'SELECT s.tier, s.n FROM (SELECT tier, count(*) AS n FROM shop_customers GROUP BY tier) s',
      'which can be NULL',
    ],
    ['SELECT d.tier FROM (SELECT DISTINCT tier FROM shop_customers) d', 'which can be NULL'],
    ['SELECT id FROM (SELECT id FROM shop_orders)', 'needs an alias'],
    ['SELECT x.a FROM (VALUES (1)) x(a)', 'VALUES in FROM'],
    [
      'SELECT x.a FROM (SELECT id, name FROM shop_customers) AS x (a, b, c)',
      'has 2 columns available but 3 columns specified',
    ],
    [
      'WITH w AS (DELETE FROM shop_orders RETURNING id) SELECT id FROM w',
      'a WITH query that is not a SELECT',
    ],
  ];
  it.each(refusedStatements)('refuses %s with validation naming it', async (select, named) => {
    await expectRefusedAs(live, select, named);
  });
});
