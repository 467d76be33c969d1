import { describe, expect, it } from 'vitest';
import type { TrellisError } from '../src/engine/index.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// DISTINCT ON in a view's SQL (issue #26, ADR 0065): kept as the GROUP BY of its DISTINCT
// ON expressions, each partition recomputed from its rows when one of them changes. Each
// target is compared with the statement as written, run by Postgres (the oracle): where
// the ORDER BY can tie, the oracle's statement adds the tiebreak the engine documents
// (the selected items, in order, ascending), so both sides are deterministic.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE customers (id int PRIMARY KEY, region text, name text NOT NULL);
      CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, at timestamptz NOT NULL,
        total numeric, note text);
      CREATE INDEX ON orders (customer_id);
      INSERT INTO customers SELECT k, CASE WHEN k % 4 = 0 THEN NULL ELSE 'r' || k % 3 END, 'c' || k
        FROM generate_series(1, 12) k;
      INSERT INTO orders SELECT k, 1 + k % 10, timestamptz '2026-01-01' + k * interval '1 hour',
        CASE WHEN k % 7 = 0 THEN NULL ELSE (k * 37) % 50 END,
        CASE WHEN k % 3 = 0 THEN NULL ELSE 'n' || k END
        FROM generate_series(1, 80) k;`);
  },
});

// The latest order per customer: the ORDER BY ends with the key, so nothing ties.
const latest: Definition = {
  form: 'as',
  target: 'latest_order',
  select: 'DISTINCT ON (customer_id) customer_id, id, at, total, note',
  from: 'orders ORDER BY customer_id, at DESC, id',
};

// The largest order per customer, where totals tie (and are NULL: DESC puts NULLs first,
// as Postgres does). The statement leaves ties to the engine; the oracle's adds the
// tiebreak the engine documents: the items in order, ascending.
const largestStatement = `TRANSFORM largest_order AS
  SELECT DISTINCT ON (o.customer_id) o.customer_id, o.total AS amount, o.id
    FROM orders o ORDER BY o.customer_id, o.total DESC`;
const largest: Definition = {
  form: 'as',
  target: 'largest_order',
  select: 'DISTINCT ON (o.customer_id) o.customer_id, o.total AS amount, o.id',
  from: 'orders o ORDER BY o.customer_id, o.total DESC, o.customer_id, o.total, o.id',
};

// row_number() over tied totals: the engine breaks ties by the table's key, ascending
// (the oracle's statement says so).
const cheapestStatement = `TRANSFORM cheapest_two AS
  SELECT c.id, c.customer_id, c.total, c.n FROM (
    SELECT id, customer_id, total, row_number() OVER (PARTITION BY customer_id ORDER BY total) AS n
      FROM orders) AS c
   WHERE c.n <= 2 AND c.total IS NOT NULL`;
const cheapest: Definition = {
  form: 'as',
  target: 'cheapest_two',
  select: 'c.id, c.customer_id, c.total, c.n',
  from: `(SELECT id, customer_id, total, row_number() OVER (PARTITION BY customer_id ORDER BY total, id) AS n
            FROM orders) AS c WHERE c.n <= 2 AND c.total IS NOT NULL`,
};

// Over a join with a WHERE, partitioned by a nullable column, ordered by an output name.
const perRegion: Definition = {
  form: 'as',
  target: 'first_per_region',
  select: 'DISTINCT ON (c.region) c.region, c.name, o.id AS order_id, o.at AS placed',
  from: `orders o JOIN customers c ON c.id = o.customer_id
    WHERE o.total IS NOT NULL ORDER BY c.region, placed, order_id`,
};

const steps: string[] = [
  // New rows in partitions: some new latest, some not; a new partition.
  `INSERT INTO orders VALUES (81, 1, '2026-06-01', 5, 'new top'), (82, 2, '2025-01-01', 49, 'old'),
     (83, 11, '2026-02-01', NULL, NULL), (84, 12, '2026-02-02', 12, 'x');`,
  // The order column changed so the top row changes (up and down); ties made.
  `UPDATE orders SET at = '2027-01-01' WHERE id = 20;
   UPDATE orders SET at = '2020-01-01' WHERE id = 81;
   UPDATE orders SET total = 49 WHERE id IN (3, 13, 23);
   UPDATE orders SET total = 0 WHERE id IN (5, 15, 25);
   UPDATE customers SET region = 'r1' WHERE id = 4;`,
  // The top row deleted; rows moving between partitions (customer_id changes, region changes).
  `DELETE FROM orders WHERE id IN (20, 82);
   UPDATE orders SET customer_id = 5 WHERE id IN (1, 11, 21);
   UPDATE orders SET customer_id = 3 WHERE id = 84;
   UPDATE customers SET region = NULL WHERE id IN (1, 2);`,
  // A partition emptied, then refilled in the next step; a key change.
  `DELETE FROM orders WHERE customer_id = 7;
   UPDATE orders SET id = 1000 WHERE id = 30;
   UPDATE orders SET total = NULL WHERE customer_id = 8;`,
  `INSERT INTO orders VALUES (90, 7, '2026-01-05', 3, 'back'), (91, 7, '2026-01-04', 3, NULL);
   DELETE FROM customers WHERE id = 12;
   UPDATE orders SET total = total + 1 WHERE id % 5 = 0;`,
];

// The three largest orders per customer (row_number, ties broken by the key as the
// statement's ORDER BY does itself), rank() <= 2 (ties all kept) and dense_rank() <= 2.
const top3: Definition = {
  form: 'as',
  target: 'top3_orders',
  select: 's.customer_id, s.id, s.total, s.rn',
  from: `(SELECT id, customer_id, total,
            row_number() OVER (PARTITION BY customer_id ORDER BY total DESC NULLS LAST, id) AS rn
          FROM orders WHERE note IS DISTINCT FROM 'skip') s WHERE s.rn <= 3`,
};
const ranked: Definition = {
  form: 'as',
  target: 'ranked_orders',
  select: 'r.id, r.customer_id, r.total, r.rk',
  from: `(SELECT id, customer_id, total, rank() OVER (PARTITION BY customer_id ORDER BY total) AS rk
          FROM orders) AS r WHERE rk < 3`,
};
const dense: Definition = {
  form: 'as',
  target: 'dense_orders',
  select: 'd.id, d.customer_id, d.total, d.dr',
  from: `(SELECT id, customer_id, total, dense_rank() OVER (PARTITION BY customer_id ORDER BY total DESC) dr
          FROM orders) d WHERE d.dr <= 2`,
};

// DISTINCT ON in a derived table, aggregated around it; the sum of each customer's two
// largest orders (an aggregate over top-N); the first order of each customer as rn = 1.
const latestNoted: Definition = {
  form: 'as',
  target: 'latest_noted',
  select: 'l.note IS NULL AS no_note, count(*) AS n, sum(l.total) AS total',
  from: `(SELECT DISTINCT ON (customer_id) customer_id, note, total FROM orders
          ORDER BY customer_id, at DESC, id) AS l`,
  groupBy: 'l.note IS NULL',
};
const topTwoSum: Definition = {
  form: 'as',
  target: 'top_two_sum',
  select: 't.customer_id, sum(t.total) AS top_sum, count(*) AS n',
  from: `(SELECT customer_id, total,
            row_number() OVER (PARTITION BY customer_id ORDER BY total DESC NULLS LAST, id) AS rn
          FROM orders) t WHERE t.rn <= 2`,
  groupBy: 't.customer_id',
};
const firstOrder: Definition = {
  form: 'as',
  target: 'first_order',
  select: 'f.id, f.customer_id, f.at',
  from: `(SELECT id, customer_id, at, row_number() OVER (PARTITION BY customer_id ORDER BY at, id) AS k
          FROM orders) f WHERE f.k = 1`,
};

// Top-N over a join: each customer's two latest orders, for customers in a region. (The
// part is keyed by both tables' keys, so the statement selects both: a key it did not
// select would be a column its target adds, as for any projection part, ADR 0056.)
const latestTwoNamed: Definition = {
  form: 'as',
  target: 'latest_two_named',
  select: 'x.order_id, x.cid, x.name, x.pos',
  from: `(SELECT o.id AS order_id, c.id AS cid, c.name,
            row_number() OVER (PARTITION BY o.customer_id ORDER BY o.at DESC, o.id) AS pos
          FROM orders o JOIN customers c ON c.id = o.customer_id WHERE c.region IS NOT NULL) x
   WHERE x.pos <= 2`,
};

const defined = [
  latest,
  perRegion,
  top3,
  ranked,
  dense,
  latestNoted,
  topTwoSum,
  firstOrder,
  latestTwoNamed,
];
const all = [...defined, largest, cheapest];

describe('DISTINCT ON', () => {
  it('keeps the first row of each partition through writes, compared with Postgres', async () => {
    await live.define(...defined);
    await live.trellis.apply(largestStatement);
    await live.trellis.apply(cheapestStatement);
    await live.converged(all);
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await live.converged(all);
    }
    // Writers at once: each inserts in its own range of keys, changes the order columns,
    // moves rows between partitions and deletes a partition's top row; one of each
    // writer's transactions rolls back.
    let seed = 26;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const writer = async (w: number) => {
      for (let round = 0; round < 6; round++) {
        const id = 2000 + w * 100 + round;
        const statements = [
          `INSERT INTO orders VALUES (${id}, ${1 + rand(12)}, '2026-01-01'::timestamptz + ${rand(500)} * interval '1 hour', ${rand(4) === 0 ? 'NULL' : rand(50)}, ${rand(3) === 0 ? 'NULL' : `'w${w}'`})`,
          `UPDATE orders SET total = ${rand(50)}, at = at + interval '${rand(90)} hours' WHERE id % 9 = ${rand(9)}`,
          `UPDATE orders SET customer_id = ${1 + rand(12)} WHERE id = (SELECT min(id) FROM orders WHERE customer_id = ${1 + rand(12)})`,
          `DELETE FROM orders WHERE id = (SELECT id FROM orders WHERE customer_id = ${1 + rand(12)} ORDER BY at DESC, id LIMIT 1)`,
        ];
        await live.db.sql
          .begin(async (tx) => {
            for (const statement of statements) await tx.unsafe(statement);
            if (round === 3) throw new Error('rolled back');
          })
          .catch((e: unknown) => {
            // A deadlock between two writers rolls one back too.
            const code = (e as { code?: string }).code;
            if (!(e instanceof Error && e.message === 'rolled back') && code !== '40P01') throw e;
          });
      }
    };
    await Promise.all([1, 2, 3, 4].map(writer));
    await live.converged(all);

    // The targets are not empty, and ties were there to break.
    const [n] = await live.db.sql<{ top3: number; ranked: number; ties: number }[]>`
      SELECT (SELECT count(*) FROM top3_orders)::int AS top3,
             (SELECT count(*) FROM ranked_orders)::int AS ranked,
             (SELECT count(*) FROM (SELECT customer_id, total FROM orders
                                     GROUP BY 1, 2 HAVING count(*) > 1) t)::int AS ties`;
    expect(n!.top3).toBeGreaterThan(10);
    expect(n!.ranked).toBeGreaterThan(10);
    expect(n!.ties).toBeGreaterThan(0);
  }, 240_000);

  it('shows the statement as written, which defines the same transform again', async () => {
    const defs = await live.trellis.definitions();
    expect(defs.map((d) => d.target).filter((t) => t.startsWith('trellis#'))).toEqual([]);
    const d = defs.find((x) => x.target === 'largest_order');
    expect(d?.statement).toBe(
      'TRANSFORM largest_order AS SELECT DISTINCT ON (o.customer_id) o.customer_id, o.total AS amount, o.id FROM public.orders AS o ORDER BY o.customer_id, o.total DESC',
    );
    const t = defs.find((x) => x.target === 'cheapest_two');
    expect(t?.statement).toBe(
      'TRANSFORM cheapest_two AS SELECT c.id AS id, c.customer_id AS customer_id, c.total AS total, c.n AS n FROM (SELECT id, customer_id, total, row_number() OVER (PARTITION BY customer_id ORDER BY total) AS n FROM orders) AS c WHERE c.n <= 2 AND c.total IS NOT NULL',
    );
    expect(t?.parts?.map((p) => p.name)).toEqual(['c.topn', 'c']);
    for (const [name, def] of [
      ['largest_order', largest],
      ['cheapest_two', cheapest],
    ] as const) {
      const statement = defs.find((x) => x.target === name)!.statement;
      await live.trellis.apply(`DROP TRANSFORM ${name}`);
      await live.trellis.apply(statement);
      await live.converged(def);
      const again = (await live.trellis.definitions()).find((x) => x.target === name);
      expect(again?.statement).toBe(statement);
    }
  });

  it("ALTER … ADD COLUMN extends a DISTINCT ON with the first row's value", async () => {
    await live.trellis.apply('ALTER TRANSFORM latest_order ADD COLUMN upper(note) AS loud');
    await live.converged({
      ...latest,
      select: 'DISTINCT ON (customer_id) customer_id, id, at, total, note, upper(note) AS loud',
    });
    await live.db.sql.unsafe(`INSERT INTO orders VALUES (3000, 2, '2030-01-01', 1, 'newest')`);
    await live.converged({
      ...latest,
      select: 'DISTINCT ON (customer_id) customer_id, id, at, total, note, upper(note) AS loud',
    });
  });

  it('refuses what it does not keep, naming it', async () => {
    const cases: Array<[string, string]> = [
      [
        'SELECT DISTINCT ON (customer_id) customer_id, id FROM orders',
        'DISTINCT ON without ORDER BY',
      ],
      [
        'SELECT DISTINCT ON (customer_id) customer_id, id FROM orders ORDER BY 1, 2',
        'ORDER BY a position',
      ],
      [
        'SELECT id, lag(total) OVER (PARTITION BY customer_id ORDER BY at) AS prev FROM orders',
        'a window function (lag() OVER',
      ],
      [
        'SELECT id, row_number() OVER (PARTITION BY customer_id ORDER BY at) AS rn FROM orders',
        'kept only as top-N per partition',
      ],
      [
        'SELECT s.id FROM (SELECT id, rank() OVER (PARTITION BY customer_id ORDER BY at) AS r FROM orders) s WHERE s.id > 3',
        'must filter it with WHERE r <= k',
      ],
      [
        'SELECT s.id FROM (SELECT id, rank() OVER (ORDER BY at) AS r FROM orders) s WHERE r <= 3',
        'without PARTITION BY',
      ],
      [
        'SELECT s.id FROM (SELECT id, sum(total) OVER (PARTITION BY customer_id ORDER BY at ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS r FROM orders) s',
        'a window function (sum() OVER',
      ],
      [
        'SELECT s.id FROM (SELECT id, rank() OVER (PARTITION BY customer_id ORDER BY at ROWS UNBOUNDED PRECEDING) AS r FROM orders) s WHERE r <= 3',
        'a window frame (ROWS',
      ],
      [
        // Over a subquery (ADR 0073), partitioned by a column that can be NULL: the part of
        // each partition's top k is keyed by it, and a part's key is never NULL (ADR 0056).
        'SELECT s.id FROM (SELECT o.id, rank() OVER (PARTITION BY note ORDER BY o.at) AS r FROM (SELECT id, note, at FROM orders) o) s WHERE r <= 3',
        'which can be NULL',
      ],
    ];
    for (const [select, named] of cases) await expectRefusedAs(live, select, named);
    // Redefined in place to a ranking SELECT: refused too, never kept without its rank.
    const refused = await live.trellis
      .apply(
        'ALTER TRANSFORM latest_order AS SELECT id, customer_id, rank() OVER (PARTITION BY customer_id ORDER BY at) AS r FROM orders',
      )
      .catch((e: unknown) => e);
    expect((refused as TrellisError).code).toBe('validation');
    expect((refused as TrellisError).message).toContain('kept only as top-N per partition');
  });

  it('reads a changed partition through an index on its partition columns (a gap is reported)', async () => {
    await live.db.sql.unsafe(`CREATE TABLE events (id int PRIMARY KEY, grp int NOT NULL, at int NOT NULL);
      INSERT INTO events SELECT k, k % 5, k FROM generate_series(1, 40) k`);
    await live.trellis.apply(
      'TRANSFORM last_event AS SELECT DISTINCT ON (grp) grp, id, at FROM events ORDER BY grp, at DESC',
    );
    await live.trellis.apply(`TRANSFORM two_events AS SELECT e.grp, e.id FROM (
        SELECT grp, id, row_number() OVER (PARTITION BY grp ORDER BY at) AS rn FROM events) e WHERE e.rn <= 2`);
    // Without an index on grp, each changed partition would be a scan: both report it.
    expect((await live.trellis.status('last_event')).sourceIndexGaps).toEqual([
      expect.objectContaining({ table: 'public.events', columns: ['grp'] }),
    ]);
    const parts = (await live.trellis.definitions()).find((d) => d.target === 'two_events')?.parts;
    expect(parts?.flatMap((p) => p.sourceIndexGaps)).toEqual([
      expect.objectContaining({ table: 'public.events', columns: ['grp'] }),
      expect.objectContaining({ table: 'public.events', columns: ['grp'] }),
    ]);
    // explain() shows the chain: the partition's top k (a group recompute), the ranked rows,
    // the statement.
    const e = await live.trellis.explain('two_events');
    expect(e.chain).toEqual(['trellis#two_events#e.topn', 'trellis#two_events#e', 'two_events']);
    expect(e.parts.map((p) => [p.name, p.mode])).toEqual([
      ['e.topn', 'group recompute'],
      ['e', 're-derive'],
      [null, 're-derive'],
    ]);
    expect((await live.trellis.explain('last_event')).parts.map((p) => p.mode)).toEqual([
      'group recompute',
    ]);
    await live.db.sql.unsafe('CREATE INDEX ON events (grp)');
    expect((await live.trellis.status('last_event')).sourceIndexGaps).toEqual([]);
  });
});
