import { describe, expect, it } from 'vitest';
import { TrellisError } from '../src/engine/index.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

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

describe('subqueries in FROM and WITH', () => {
  it('maintains TPC-H Q13 (an aggregate over an aggregate, with column aliases)', async () => {
    await live.define(q13);
    await live.converged(q13);
  });
});
