import { describe, expect, it } from 'vitest';
import type { TrellisError } from '../src/engine/index.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { waitFor, waitForStatus } from './support/trellis.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// A view's SQL as Postgres writes it: TRANSFORM name AS <select> (issue #26, ADR 0049).
// Each target is compared with its SELECT recomputed by Postgres (the oracle), after
// inserts, updates of keys and join columns, deletes and NULLs on every source.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE regions (code text PRIMARY KEY, label text);
      CREATE TABLE customers (id int PRIMARY KEY, name text, tier text, region_code text);
      CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric, status text, qty int);
      INSERT INTO regions VALUES ('eu', 'Europe'), ('us', 'Americas');
      INSERT INTO customers VALUES (1, 'ann', 'gold', 'eu'), (2, 'bob', 'silver', 'us'),
        (3, 'cy', 'gold', NULL), (4, 'di', NULL, 'eu');
      INSERT INTO orders VALUES (1, 1, 10.5, 'paid', 2), (2, 1, 3, 'open', 1), (3, 2, 7, 'paid', 5),
        (4, 3, NULL, NULL, 1), (5, NULL, 2, 'void', 0), (6, 2, 7, 'paid', 5);`);
  },
});

/** Every kind of write on every source: keys and join columns move, rows come and go, NULLs. */
async function churn(): Promise<void> {
  await live.db.sql.unsafe(`
    INSERT INTO orders VALUES (7, 4, 1, 'paid', 3), (8, 4, 1, 'paid', 3), (9, 99, 5, 'open', 2);
    UPDATE orders SET customer_id = 3 WHERE id = 1;
    UPDATE orders SET id = 10 WHERE id = 2;
    UPDATE orders SET status = NULL, amount = 4 WHERE id = 3;
    UPDATE orders SET status = 'paid' WHERE id = 4;
    DELETE FROM orders WHERE id = 6;
    UPDATE customers SET tier = 'silver' WHERE id = 1;
    UPDATE customers SET id = 5 WHERE id = 2;
    UPDATE customers SET region_code = 'us', tier = NULL WHERE id = 3;
    INSERT INTO customers VALUES (99, 'eve', 'bronze', 'xx');
    DELETE FROM customers WHERE id = 4;
    UPDATE regions SET label = NULL WHERE code = 'eu';
    UPDATE regions SET code = 'na' WHERE code = 'us';
    INSERT INTO regions VALUES ('us', 'USA');`);
  await live.db.sql.unsafe(`
    UPDATE customers SET id = 2 WHERE id = 5;
    UPDATE orders SET customer_id = NULL WHERE id = 9;
    DELETE FROM regions WHERE code = 'na';
    INSERT INTO orders VALUES (11, 1, 0, 'open', NULL);`);
}

const projection: Definition = {
  form: 'as',
  target: 'as_projection',
  from: 'orders o JOIN customers c ON c.id = o.customer_id',
  select: 'o.amount, c.name, o.status AS state',
  where: "o.status IS DISTINCT FROM 'void'",
  implicit: 'o.id AS id, c.id AS c_id',
};
const leftJoinOrdered: Definition = {
  form: 'as',
  target: 'as_left_join',
  from: `customers AS c LEFT OUTER JOIN orders o ON o.customer_id = c.id AND o.qty > 1
         LEFT JOIN regions r ON r.code = c.region_code`,
  select: 'c.name, o.amount amt, r.label',
  implicit: 'c.id AS id, o.id AS o_id, r.code AS code',
  // Meaningless for a table: accepted and dropped.
  orderBy: 'c.name DESC NULLS LAST, 2',
};
const aggregate: Definition = {
  form: 'as',
  target: 'as_aggregate',
  from: 'orders AS o INNER JOIN customers AS c ON c.id = o.customer_id',
  select: 'c.tier, sum(o.amount) AS total, count(*) n, max(o.qty) AS top_qty',
  groupBy: 'c.tier',
  having: 'count(*) > 0',
};
const distinctJoined: Definition = {
  form: 'as',
  target: 'as_distinct_joined',
  distinct: true,
  from: 'orders o JOIN customers c ON c.id = o.customer_id',
  select: 'c.tier, o.status',
};
const distinctExpressions: Definition = {
  form: 'as',
  target: 'as_distinct_exprs',
  distinct: true,
  from: 'orders',
  select: "lower(coalesce(status, 'none')) st, qty AS quantity",
  where: 'qty IS DISTINCT FROM 0',
};
// SELECT DISTINCT in the FROM-first form too.
const distinctFromFirst: Definition = {
  target: 'ff_distinct',
  distinct: true,
  from: 'orders o LEFT JOIN customers c ON c.id = o.customer_id',
  select: 'c.tier, o.qty',
};

describe('TRANSFORM name AS <select>', () => {
  it('maintains projections, joins, aggregates and SELECT DISTINCT written as a view, through every kind of write', async () => {
    const all = [
      projection,
      leftJoinOrdered,
      aggregate,
      distinctJoined,
      distinctExpressions,
      distinctFromFirst,
    ];
    await live.define(...all);
    await live.converged(all);
    await churn();
    await live.converged(all);
  });

  it('records the statement in the AS form, without its ORDER BY, and keys SELECT DISTINCT by every column', async () => {
    const defs = await live.trellis.definitions();
    const left = defs.find((d) => d.target === 'as_left_join');
    expect(left?.statement).toMatch(/^TRANSFORM as_left_join AS SELECT /);
    expect(left?.statement).not.toContain('ORDER BY');
    const distinct = defs.find((d) => d.target === 'as_distinct_exprs');
    expect(distinct?.statement).toMatch(/^TRANSFORM as_distinct_exprs AS SELECT DISTINCT /);
    expect(distinct?.columns.map((c) => [c.name, c.key])).toEqual([
      ['st', true],
      ['quantity', true],
    ]);
  });

  it('moves existing view SQL over by adding one line', async () => {
    await live.db.sql.unsafe(`
      CREATE MATERIALIZED VIEW paid_by_customer AS
      SELECT c.name, sum(o.amount) AS paid
        FROM orders o JOIN customers c ON c.id = o.customer_id
       WHERE o.status = 'paid'
       GROUP BY c.name`);
    const [view] = await live.db.sql<{ def: string }[]>`
      SELECT pg_get_viewdef('paid_by_customer'::regclass, true) AS def`;
    // As pg_get_viewdef() writes it, its final semicolon included.
    const body = view!.def.trim();
    await live.trellis.apply(`TRANSFORM paid_by_customer_t AS\n${body}`);
    const def: Definition = {
      form: 'as',
      target: 'paid_by_customer_t',
      from: 'orders o JOIN customers c ON c.id = o.customer_id',
      select: 'c.name, sum(o.amount) AS paid',
      where: "o.status = 'paid'",
      groupBy: 'c.name',
    };
    await live.converged(def);
    await live.db.sql.unsafe(`
      UPDATE orders SET status = 'paid' WHERE id = 11;
      UPDATE customers SET name = 'ann2' WHERE id = 1;
      DELETE FROM orders WHERE id = 7;`);
    await live.converged(def);
  });
});

describe('a view defined with AS, like any transform', () => {
  it('follows a renamed column; ALTER … ADD COLUMN extends it (refused for DISTINCT)', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE items (id int PRIMARY KEY, kind text, size int);
      INSERT INTO items VALUES (1, 'a', 1), (2, 'a', 4), (3, 'b', NULL), (4, NULL, 2), (5, 'a', 1);`);
    const rows: Definition = {
      form: 'as',
      target: 'as_items_rows',
      from: 'items i',
      select: 'i.kind, i.size',
      where: 'i.size IS NOT NULL',
      implicit: 'i.id AS id',
    };
    const kinds: Definition = {
      form: 'as',
      target: 'as_items_kinds',
      distinct: true,
      from: 'items',
      select: 'kind, size % 3 AS bucket',
    };
    await live.define(rows, kinds);
    await live.converged([rows, kinds]);

    // A renamed column is followed (ADR 0047): each view's statement takes the new name.
    const statementsRead = async (name: RegExp) =>
      (await live.trellis.definitions())
        .filter((d) => d.target === rows.target || d.target === kinds.target)
        .every((d) => name.test(d.statement));
    await live.db.sql`ALTER TABLE items RENAME COLUMN size TO sz`;
    await waitFor(() => statementsRead(/\bsz\b/), 'both views to follow the renamed column');
    await live.db.sql.unsafe(`
      UPDATE items SET sz = 7 WHERE id = 3;
      ALTER TABLE items RENAME COLUMN sz TO size;
      INSERT INTO items VALUES (6, 'c', 9);`);
    await waitFor(() => statementsRead(/^(?!.*\bsz\b)/s), 'both views to follow it back');
    for (const d of [rows, kinds]) {
      expect((await live.trellis.status(d.target)).captureFailure).toBeNull();
    }
    await live.converged([rows, kinds]);

    await live.trellis.apply('ALTER TRANSFORM as_items_rows ADD COLUMN i.size * 2 AS twice');
    const wider = { ...rows, select: 'i.kind, i.size, i.size * 2 AS twice' };
    await waitForStatus(live.trellis, wider.target, 'live');
    // SELECT DISTINCT is keyed by every column: a column more would be another key.
    const refused = await live.trellis
      .apply('ALTER TRANSFORM as_items_kinds ADD COLUMN id % 2 AS odd')
      .catch((e: unknown) => e as TrellisError);
    expect(refused).toMatchObject({ code: 'validation' });
    expect((refused as TrellisError).message).toContain('SELECT DISTINCT, keyed by every column');
    await live.db.sql.unsafe(`
      UPDATE items SET size = 3, id = 10 WHERE id = 1;
      DELETE FROM items WHERE id = 4;`);
    await live.converged([wider, kinds]);
    const [statement] = (await live.trellis.definitions())
      .filter((d) => d.target === 'as_items_rows')
      .map((d) => d.statement);
    expect(statement).toMatch(
      /^TRANSFORM as_items_rows AS SELECT .* AS twice FROM public\.items AS i WHERE /,
    );
  });
});

describe('what the AS form refuses, by name', () => {
  const refused: Array<[string, string]> = [
    // EXISTS and IN AND-ed at the top of WHERE are semi-joins (view-sql-semi-joins.test.ts).
    ['SELECT o.id FROM orders o WHERE o.customer_id > (SELECT 1)', 'a subquery in WHERE'],
    // An OR of them too (view-sql-not-in.test.ts), but not one nested deeper under it.
    [
      'SELECT o.id FROM orders o WHERE o.id = 1 OR (o.id > 2 AND EXISTS (SELECT 1 FROM customers c WHERE c.id = o.customer_id))',
      'under an OR',
    ],
    [
      'SELECT o.id, ARRAY(SELECT id FROM customers) AS n FROM orders o',
      'a subquery in the SELECT list',
    ],
    [
      'SELECT status, count(*) AS n FROM orders GROUP BY status HAVING count(*) > ALL (SELECT 1)',
      'a subquery in HAVING',
    ],
    [
      'SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id AND c.id IN (SELECT 1)',
      'a subquery in a join condition (ON)',
    ],
    ['SELECT x.id FROM (SELECT id FROM orders)', 'a subquery in FROM needs an alias'],
    [
      'WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x) SELECT n FROM x',
      'a recursive WITH clause',
    ],
    [
      'SELECT upper(name) FROM customers INTERSECT ALL SELECT name FROM customers',
      'a column of a set operation must be named in its first SELECT',
    ],
    ['SELECT id, rank() OVER (ORDER BY amount) AS r FROM orders', 'a window function'],
    ['SELECT DISTINCT ON (customer_id) customer_id, amount FROM orders', 'DISTINCT ON'],
    [
      'SELECT id FROM orders o JOIN regions r ON true RIGHT JOIN customers c ON c.id = o.customer_id',
      'a RIGHT JOIN after another join needs every column written with its table',
    ],
    [
      'SELECT c.tier || o.id, count(*) AS n FROM orders o FULL OUTER JOIN customers c ON c.id = o.customer_id GROUP BY 1',
      'GROUP BY over a FULL JOIN: name this column',
    ],
    ['SELECT o.id FROM orders o CROSS JOIN customers c', 'CROSS JOIN'],
    ['SELECT o.id FROM orders o JOIN customers c USING (id)', 'JOIN ... USING'],
    ['SELECT o.id FROM orders o NATURAL JOIN customers c', 'NATURAL JOIN'],
    [
      'SELECT o.id, x.n FROM orders o CROSS JOIN LATERAL generate_series(1, o.qty) x(n)',
      'CROSS JOIN',
    ],
    ['SELECT o.id, x FROM orders o JOIN LATERAL (SELECT o.qty AS x) l ON true', 'LATERAL'],
    ['SELECT n FROM generate_series(1, 3) n', 'a set-returning function in FROM'],
    [
      'SELECT id, generate_series(1, qty) AS n FROM orders',
      'a set-returning function in the SELECT list',
    ],
    ['SELECT id, random() AS r FROM orders', 'volatile function random()'],
    ['SELECT id FROM orders LIMIT 10', 'LIMIT is not supported'],
    ['SELECT id FROM orders ORDER BY id LIMIT 10', 'LIMIT is not supported'],
    ['SELECT id FROM orders OFFSET 1', 'OFFSET is not supported'],
    ['SELECT DISTINCT count(*) AS n FROM orders', 'SELECT DISTINCT over aggregates'],
    ['SELECT DISTINCT status FROM orders GROUP BY status', 'SELECT DISTINCT with GROUP BY'],
    ['(SELECT id FROM orders)', 'a SELECT in parentheses'],
  ];
  it.each(refused)('refuses %s with validation naming it', async (select, named) => {
    await expectRefusedAs(live, select, named);
  });

  it('tells a statement with neither FROM nor AS after its name', async () => {
    const error = (await live.trellis
      .apply('TRANSFORM t SELECT a FROM s')
      .catch((e: unknown) => e)) as TrellisError;
    expect({ code: error.code, message: error.message }).toMatchObject({
      code: 'parse',
      message: expect.stringContaining('expected FROM or AS, found "SELECT"'),
    });
  });
});
