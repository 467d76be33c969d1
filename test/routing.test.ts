import { describe, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

// A change must reach every target row it touched, before and after it (ENGINE.md,
// capture; I7): through the old and the new join rows of the changed row, including join
// rows a WHERE filtered out, whose change can make another row appear (an anti-join's
// NULL-extended row when the last match goes away).

const live = livePipeline();

describe('routing through old and new join rows', () => {
  it('an anti-join row reappears when its match is deleted, re-keyed or filtered away', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE anti_b (id int PRIMARY KEY, flag boolean NOT NULL, code text);
      CREATE TABLE anti_a (id int PRIMARY KEY, b_id int, g int NOT NULL);
      INSERT INTO anti_b SELECT i, true, 'c' || i FROM generate_series(1, 40) i;
      INSERT INTO anti_a SELECT i, i % 50, i % 7 FROM generate_series(1, 200) i;`);
    const rows: Definition = {
      target: 'anti_rows',
      from: 'anti_a a LEFT JOIN anti_b b ON b.id = a.b_id AND b.flag',
      select: 'a.id AS id, a.g AS g',
      where: 'b.id IS NULL',
      implicit: 'b.id AS b_id',
    };
    const grouped: Definition = {
      target: 'anti_groups',
      from: 'anti_a a LEFT JOIN anti_b b ON b.id = a.b_id AND b.flag',
      select: 'a.g AS g, count(*) AS n, sum(a.id) AS ids',
      where: 'b.id IS NULL',
      groupBy: 'a.g',
    };
    await live.define(rows);
    await live.converged(rows);
    await live.define(grouped);
    await live.converged(grouped);
    // Each way for an a row to lose its last match: the b row deleted, its key changed,
    // its flag set to false; and the reverse, a match coming back.
    await live.db.sql`DELETE FROM anti_b WHERE id = 3`;
    await live.db.sql`UPDATE anti_b SET id = 1003 WHERE id = 4`;
    await live.db.sql`UPDATE anti_b SET flag = false WHERE id IN (5, 6)`;
    await live.converged([rows, grouped]);
    await live.db.sql`UPDATE anti_b SET flag = true WHERE id = 5`;
    await live.db.sql`INSERT INTO anti_b VALUES (3, true, 'back')`;
    await live.db.sql`UPDATE anti_a SET b_id = 7 WHERE id IN (10, 11)`;
    await live.converged([rows, grouped]);
  });

  it('an inner join with a WHERE on the joined side, a HAVING, and a chain follow every change', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE ij_cat (id int PRIMARY KEY, active boolean NOT NULL, label text NOT NULL);
      CREATE TABLE ij_item (id int PRIMARY KEY, cat_id int NOT NULL, price numeric NOT NULL);
      INSERT INTO ij_cat SELECT i, i % 3 <> 0, 'cat' || i FROM generate_series(1, 30) i;
      INSERT INTO ij_item SELECT i, 1 + i % 30, i FROM generate_series(1, 300) i;`);
    const active: Definition = {
      target: 'ij_active',
      from: 'ij_item i JOIN ij_cat c ON c.id = i.cat_id',
      select: 'i.id AS id, c.label AS label, i.price AS price',
      where: 'c.active',
      implicit: 'c.id AS c_id',
    };
    const big: Definition = {
      target: 'ij_big',
      from: 'ij_item i JOIN ij_cat c ON c.id = i.cat_id',
      select: 'c.label AS label, sum(i.price) AS total',
      where: 'c.active',
      groupBy: 'c.label',
      having: 'sum(i.price) > 1500',
    };
    const chained: Definition = {
      target: 'ij_chained',
      from: 'ij_active',
      select: 'label, price * 2 AS doubled',
      where: "label <> 'cat7'",
      implicit: 'id, c_id',
      reads: [active],
    };
    await live.define(active);
    await live.converged(active);
    await live.define(big);
    await live.converged(big);
    await live.define(chained);
    await live.converged(chained);
    await live.db.sql`UPDATE ij_cat SET active = NOT active WHERE id % 4 = 0`;
    await live.db.sql`UPDATE ij_cat SET label = label || '!' WHERE id = 7`;
    await live.db.sql`UPDATE ij_item SET cat_id = 3 WHERE id % 10 = 1`;
    await live.db.sql`DELETE FROM ij_cat WHERE id = 8`;
    await live.db.sql`UPDATE ij_item SET price = price + 1000 WHERE cat_id = 10`;
    await live.converged([active, big, chained]);
  });

  it('a NOT IN written as an anti-join over three tables (TPC-H Q16 shape) survives churn', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE q_supplier (s_suppkey int PRIMARY KEY, s_comment text NOT NULL);
      CREATE TABLE q_part (p_partkey int PRIMARY KEY, p_brand text NOT NULL, p_size int NOT NULL);
      CREATE TABLE q_partsupp (ps_partkey int, ps_suppkey int, PRIMARY KEY (ps_partkey, ps_suppkey));
      INSERT INTO q_supplier SELECT i, CASE WHEN i % 9 = 0 THEN 'Customer Complaints' ELSE 'ok' END
        FROM generate_series(1, 60) i;
      INSERT INTO q_part SELECT i, 'Brand#' || (i % 5), i % 20 FROM generate_series(1, 100) i;
      INSERT INTO q_partsupp SELECT p, 1 + (p * 7 + s) % 60 FROM generate_series(1, 100) p, generate_series(1, 4) s
        ON CONFLICT DO NOTHING;`);
    const q16: Definition = {
      target: 'q16',
      from: `q_partsupp ps JOIN q_part p ON p.p_partkey = ps.ps_partkey
             LEFT JOIN q_supplier s ON s.s_suppkey = ps.ps_suppkey AND s.s_comment LIKE '%Customer%Complaints%'`,
      select:
        'p.p_brand AS p_brand, p.p_size AS p_size, count(DISTINCT ps.ps_suppkey) AS supplier_cnt',
      where: "s.s_suppkey IS NULL AND p.p_brand <> 'Brand#1'",
      groupBy: 'p.p_brand, p.p_size',
    };
    await live.define(q16);
    await live.converged(q16);
    // A supplier that stops (or starts) complaining: its partsupp rows join it no longer
    // (or again), so they turn into anti-join rows (or stop being ones).
    await live.db
      .sql`UPDATE q_supplier SET s_comment = CASE WHEN s_comment = 'ok' THEN 'Customer Complaints' ELSE 'ok' END
                  WHERE s_suppkey IN (9, 18, 20, 21)`;
    await live.converged([q16]);
    for (let round = 0; round < 3; round += 1) {
      await live.db
        .sql`UPDATE q_supplier SET s_comment = CASE WHEN s_comment = 'ok' THEN 'Customer Complaints' ELSE 'ok' END
                    WHERE s_suppkey % 7 = ${round}`;
      await live.db.sql`DELETE FROM q_supplier WHERE s_suppkey = ${10 + round}`;
      await live.db.sql`UPDATE q_part SET p_brand = 'Brand#1' WHERE p_partkey % 11 = ${round}`;
      await live.db.sql`DELETE FROM q_partsupp WHERE ps_partkey % 13 = ${round}`;
    }
    await live.converged([q16]);
  });

  it('a grand total over a join with a WHERE builds, and follows changes on either side', async () => {
    // Found by the differential test: such a transform never built (its build failed five
    // times, then paused: column "passes" of its key map does not exist).
    await live.db.sql.unsafe(`
      CREATE TABLE gt_a (id int PRIMARY KEY, flag boolean);
      CREATE TABLE gt_b (id int PRIMARY KEY, a_id int, amount int NOT NULL);
      INSERT INTO gt_a VALUES (1, true), (2, false), (3, NULL);
      INSERT INTO gt_b VALUES (10, 1, 5), (11, 1, 7), (12, 2, 100), (13, NULL, 1000);`);
    const inner: Definition = {
      target: 'gt_inner',
      from: 'gt_b b JOIN gt_a a ON a.id = b.a_id',
      select: 'count(*) AS n, sum(b.amount) AS total',
      where: 'a.flag',
    };
    const anti: Definition = {
      target: 'gt_anti',
      from: 'gt_b b LEFT JOIN gt_a a ON a.id = b.a_id AND a.flag',
      select: 'count(*) AS n, array_agg(b.id ORDER BY b.id) AS ids',
      where: 'a.id IS NULL',
      having: 'count(*) > 1',
    };
    await live.define(inner, anti);
    await live.converged([inner, anti]);
    await live.db.sql`UPDATE gt_a SET flag = true WHERE id = 2`;
    await live.db.sql`UPDATE gt_b SET a_id = 3 WHERE id = 10`;
    await live.converged([inner, anti]);
    await live.db.sql`DELETE FROM gt_a WHERE id = 1`;
    await live.db.sql`UPDATE gt_a SET flag = true`;
    await live.converged([inner, anti]);
  });
});
