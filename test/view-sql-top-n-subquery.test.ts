import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// Top-N over a subquery or a WITH query (issue #26, ADR 0073): the ranking reads the
// subquery's hidden part as its source (ADR 0056), ranked as ADR 0065 ranks a table's
// rows, ties of row_number broken by the part's key. Each target is compared with the
// statement as written, run by Postgres (the oracle); where row_number's ORDER BY can tie,
// the oracle's statement adds the tiebreak the engine documents (the part's key).

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE customers (id int PRIMARY KEY, tier int NOT NULL, name text);
      CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, total numeric, note text);
      CREATE INDEX ON orders (customer_id);
      INSERT INTO customers SELECT k, k % 3, CASE WHEN k % 5 = 0 THEN NULL ELSE 'c' || k END
        FROM generate_series(1, 12) k;
      INSERT INTO orders SELECT k, 1 + k % 10, CASE WHEN k % 7 = 0 THEN NULL ELSE (k * 37) % 50 END,
        CASE WHEN k % 3 = 0 THEN NULL ELSE 'n' || k END
        FROM generate_series(1, 80) k;`);
  },
});

// row_number over a join subquery, partitioned by a customer; nothing ties (the ORDER BY
// ends with the order's id).
const topPerCustomer: Definition = {
  form: 'as',
  target: 'top_per_customer',
  select: 'x.cid, x.oid, x.total, x.name, x.rn',
  from: `(SELECT s.cid, s.oid, s.total, s.name,
            row_number() OVER (PARTITION BY s.cid ORDER BY s.total DESC, s.oid) AS rn
          FROM (SELECT c.id AS cid, o.id AS oid, o.total, c.name
                  FROM orders o JOIN customers c ON c.id = o.customer_id
                 WHERE o.total IS NOT NULL) AS s) AS x
         WHERE x.rn <= 2`,
};

// rank() over an aggregate subquery (customers' spend, ranked within their tier): ties
// all kept, NULL sums first under DESC.
const topSpenders: Definition = {
  form: 'as',
  target: 'top_spenders',
  select: 'r.tier, r.customer_id, r.spent, r.rk',
  from: `(SELECT g.tier, g.customer_id, g.spent, rank() OVER (PARTITION BY g.tier ORDER BY g.spent DESC) AS rk
          FROM (SELECT c.tier, o.customer_id, sum(o.total) AS spent
                  FROM orders o JOIN customers c ON c.id = o.customer_id
                 GROUP BY c.tier, o.customer_id) g) AS r
         WHERE r.rk <= 2`,
};

// dense_rank() over a WITH query.
const denseBig: Definition = {
  form: 'as',
  target: 'dense_big',
  with: 'big AS (SELECT o.id, o.customer_id, o.total FROM orders o WHERE o.total > 10)',
  select: 'd.id, d.customer_id, d.total, d.dr',
  from: `(SELECT id, customer_id, total, dense_rank() OVER (PARTITION BY customer_id ORDER BY total) AS dr
          FROM big) AS d WHERE d.dr <= 2`,
};

// row_number over a WITH query holding a join, its ORDER BY tied: the engine breaks ties by
// the part's key (the order's id, then the customer's: its tables' keys in FROM order),
// which the oracle's statement states.
const cheapestStatement = `TRANSFORM cheapest_per_tier AS
  WITH oc AS (SELECT o.id, c.id AS cid, c.tier, o.total FROM orders o JOIN customers c ON c.id = o.customer_id)
  SELECT t.tier, t.id, t.cid, t.total, t.n FROM (
    SELECT tier, id, cid, total, row_number() OVER (PARTITION BY tier ORDER BY total) AS n FROM oc) AS t
   WHERE t.n < 3`;
const cheapest: Definition = {
  form: 'as',
  target: 'cheapest_per_tier',
  with: 'oc AS (SELECT o.id, c.id AS cid, c.tier, o.total FROM orders o JOIN customers c ON c.id = o.customer_id)',
  select: 't.tier, t.id, t.cid, t.total, t.n',
  from: `(SELECT tier, id, cid, total, row_number() OVER (PARTITION BY tier ORDER BY total, id, cid) AS n FROM oc) AS t
          WHERE t.n < 3`,
};

// The ranking SELECT as the WITH query itself, read once by the statement bounding its rank
// (migration 0062): over a table, and over another WITH query.
const rankedInWith: Definition = {
  form: 'as',
  target: 'ranked_in_with',
  with: `ranked AS (SELECT o.id, o.customer_id, o.total,
                           rank() OVER (PARTITION BY o.customer_id ORDER BY o.total DESC NULLS LAST) AS rk
                      FROM orders o)`,
  select: 'id, customer_id, total, rk',
  from: 'ranked WHERE rk <= 2',
};
const denseOverWith: Definition = {
  form: 'as',
  target: 'dense_over_with',
  with: `oc AS (SELECT o.id, c.id AS cid, c.tier, o.total FROM orders o JOIN customers c ON c.id = o.customer_id),
         dr AS (SELECT id, cid, tier, total, dense_rank() OVER (PARTITION BY tier ORDER BY total) AS d FROM oc)`,
  select: 'x.id, x.cid, x.tier, x.total, x.d',
  from: 'dr AS x WHERE x.d < 3',
};

const steps: string[] = [
  // New rows: some new tops, some not; a new customer.
  `INSERT INTO orders VALUES (81, 1, 49, 'new top'), (82, 2, 0, 'low'), (83, 11, NULL, NULL), (84, 12, 12, 'x');
   INSERT INTO customers VALUES (13, 1, 'c13'); INSERT INTO orders VALUES (85, 13, 30, NULL);`,
  // Values move up and down (ties made), a customer changes tier (the join side).
  `UPDATE orders SET total = 49 WHERE id IN (3, 13, 23);
   UPDATE orders SET total = 0 WHERE id IN (5, 15, 25);
   UPDATE orders SET total = NULL WHERE id = 81;
   UPDATE customers SET tier = 2 WHERE id = 4;
   UPDATE customers SET name = NULL WHERE id = 1;`,
  // Top rows deleted; rows move between partitions; key changes.
  `DELETE FROM orders WHERE id IN (3, 84);
   UPDATE orders SET customer_id = 5 WHERE id IN (1, 11, 21);
   UPDATE orders SET id = 1000 WHERE id = 30;
   UPDATE customers SET id = 20 WHERE id = 12;`,
  // A partition emptied, then refilled; a customer deleted.
  `DELETE FROM orders WHERE customer_id = 7;
   UPDATE orders SET total = NULL WHERE customer_id = 8;
   DELETE FROM customers WHERE id = 9;`,
  `INSERT INTO orders VALUES (90, 7, 3, 'back'), (91, 7, 3, NULL), (92, 20, 44, NULL);
   UPDATE orders SET total = total + 1 WHERE id % 5 = 0;
   UPDATE customers SET tier = 0 WHERE tier = 1 AND id % 2 = 0;`,
];

const all = [topPerCustomer, topSpenders, denseBig, cheapest, rankedInWith, denseOverWith];

describe('top-N over a subquery or a WITH query', () => {
  it('keeps each partition through writes on every source, compared with Postgres', async () => {
    await live.define(topPerCustomer, topSpenders, denseBig, rankedInWith, denseOverWith);
    await live.trellis.apply(cheapestStatement);
    await live.converged(all);
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await live.converged(all);
    }
    const [n] = await live.db.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM top_spenders`;
    expect(n?.n).toBeGreaterThan(3);
    // Rolled back: nothing changes.
    await live.db.sql
      .begin(async (tx) => {
        await tx.unsafe('DELETE FROM orders; DELETE FROM customers');
        throw new Error('rollback');
      })
      .catch(() => undefined);
    await live.converged(all);
  }, 600_000);

  it('shows the statement as written, which defines the same transform again', async () => {
    const defs = await live.trellis.definitions();
    const shown = defs.find((d) => d.target === 'dense_big');
    expect(shown?.statement).toBe(
      'TRANSFORM dense_big AS WITH big AS (SELECT o.id, o.customer_id, o.total FROM orders AS o WHERE o.total > 10) SELECT d.id AS id, d.customer_id AS customer_id, d.total AS total, d.dr AS dr FROM (SELECT id, customer_id, total, dense_rank() OVER (PARTITION BY customer_id ORDER BY total) AS dr FROM big) AS d WHERE d.dr <= 2',
    );
    // The ranking reads the WITH query's part; the part of each partition's top k reads it too.
    expect(shown?.parts?.map((p) => p.name)).toEqual(['big', 'd.topn', 'd']);
    expect(defs.find((d) => d.target === 'top_per_customer')?.parts?.map((p) => p.name)).toEqual([
      'x.s',
      'x.topn',
      'x',
    ]);
    for (const target of [
      'top_per_customer',
      'top_spenders',
      'dense_big',
      'cheapest_per_tier',
      'ranked_in_with',
      'dense_over_with',
    ]) {
      const d = defs.find((x) => x.target === target);
      expect(d?.statement).toMatch(/ OVER \(PARTITION BY /);
      await live.trellis.apply(`DROP TRANSFORM ${target}`);
      await live.trellis.apply(d!.statement);
      const again = (await live.trellis.definitions()).find((x) => x.target === target);
      expect(again?.statement).toBe(d!.statement);
    }
    const explained = await live.trellis.explain(
      cheapestStatement.replace('cheapest_per_tier', 'explained'),
    );
    expect({ defined: explained.defined, refused: explained.refused }).toEqual({
      defined: false,
      refused: null,
    });
    expect(explained.parts.length).toBeGreaterThan(2);
    await live.db.sql.unsafe(`INSERT INTO orders VALUES (95, 2, 48, 'again'), (96, 4, 1, NULL);
      UPDATE customers SET tier = 1 WHERE id = 2`);
    await live.converged(all);
  }, 300_000);

  it('refuses a ranking WITH query read twice, or by another level, saying how to write it', async () => {
    const ranking =
      'WITH r AS (SELECT id, customer_id, rank() OVER (PARTITION BY customer_id ORDER BY total) AS rk FROM orders)';
    for (const select of [
      `${ranking} SELECT a.id FROM r a JOIN r b ON b.id = a.id WHERE a.rk <= 2`,
      `${ranking} SELECT c.id FROM customers c WHERE EXISTS (SELECT 1 FROM r WHERE r.customer_id = c.id AND r.rk <= 2)`,
    ]) {
      await expectRefusedAs(live, select, 'is kept only as top-N per partition');
    }
  }, 60_000);
});
