import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

/**
 * Statements applying changes over a shadow join from the changed rows outward, in the
 * order the engine writes (ADR 0074): the join conditions move to WHERE and the occurrences
 * are reordered from the changed one, by the occurrences each condition names (qualified,
 * quoted, or a bare column name). Every target is compared with its definition run by
 * Postgres after each write, on every joined table, kept by group recompute and by delta.
 */
const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE j_region (r_id int PRIMARY KEY, r_name text);
      CREATE TABLE j_nation (n_id int PRIMARY KEY, n_name text, n_region int);
      CREATE TABLE j_customer (c_id int PRIMARY KEY, c_nation int, c_seg text);
      CREATE TABLE j_supplier (s_id int PRIMARY KEY, s_nation int);
      CREATE TABLE j_orders (o_id int PRIMARY KEY, o_cust int, o_day int);
      CREATE TABLE j_line (l_order int, l_no int, l_supp int, l_price numeric, l_note text,
                           PRIMARY KEY (l_order, l_no));
      CREATE INDEX ON j_orders (o_cust);
      CREATE INDEX ON j_line (l_supp);
      INSERT INTO j_region SELECT i, CASE WHEN i = 2 THEN 'ASIA' ELSE 'R' || i END FROM generate_series(0, 4) i;
      INSERT INTO j_nation SELECT i, 'N' || i, i % 5 FROM generate_series(0, 24) i;
      INSERT INTO j_customer SELECT i, (i * 7) % 25, CASE WHEN i % 3 = 0 THEN 'c_id' ELSE 'plain' END
        FROM generate_series(1, 60) i;
      INSERT INTO j_supplier SELECT i, (i * 11) % 25 FROM generate_series(1, 20) i;
      INSERT INTO j_orders SELECT i, 1 + (i * 13) % 60, i % 40 FROM generate_series(1, 300) i;
      INSERT INTO j_line SELECT o, l, 1 + (o * 3 + l) % 20, (o * l) % 97 + 0.5, 'l_no'
        FROM generate_series(1, 300) o, generate_series(1, 3) l;`);
  },
});

// Q5's shape, written with every kind of name a condition can hold: a bare column of one
// table, an alias-qualified one, a quoted alias, a condition naming three tables
// (c_nation = s_nation), and string literals spelling column names.
const byGroup: Definition = {
  target: 'j_revenue_groups',
  from: `j_customer c JOIN j_orders o ON c_id = o.o_cust AND o_day < 30
         JOIN j_line "L" ON "L".l_order = o_id
         JOIN j_supplier s ON l_supp = s.s_id AND c.c_nation = s_nation
         JOIN j_nation n ON s_nation = n.n_id
         JOIN j_region r ON n_region = r.r_id AND r.r_name = 'ASIA'`,
  select: `n_name, count(DISTINCT o_id) AS orders, sum("L".l_price) AS revenue,
           count(*) FILTER (WHERE c_seg = 'c_id' AND "L".l_note = 'l_no') AS noted`,
  groupBy: 'n_name',
};
const byDelta: Definition = {
  ...byGroup,
  target: 'j_revenue_delta',
  select: `n_name, count(*) AS lines, sum("L".l_price) AS revenue,
           count(*) FILTER (WHERE c_seg = 'c_id') AS noted`,
};

const writes = [
  // The last table of the chain, the middle ones, the first, and a join column of each.
  `UPDATE j_region SET r_name = CASE WHEN r_name = 'ASIA' THEN 'R2' ELSE r_name END WHERE r_id = 2`,
  `UPDATE j_region SET r_name = 'ASIA' WHERE r_id = 2`,
  'UPDATE j_nation SET n_region = 2 WHERE n_id = 3',
  'UPDATE j_line SET l_price = l_price + 1 WHERE l_order = 7',
  'UPDATE j_line SET l_supp = 5 WHERE l_order BETWEEN 10 AND 14 AND l_no = 2',
  'DELETE FROM j_line WHERE l_order = 21',
  "INSERT INTO j_line VALUES (21, 9, 3, 10.25, 'l_no'), (22, 9, 4, 1.5, 'x')",
  'UPDATE j_orders SET o_day = 35 - o_day WHERE o_id % 17 = 0',
  'UPDATE j_orders SET o_cust = 1 + (o_cust + 5) % 60 WHERE o_id % 23 = 0',
  "UPDATE j_customer SET c_nation = (c_nation + 3) % 25, c_seg = 'c_id' WHERE c_id % 11 = 0",
  'UPDATE j_supplier SET s_nation = (s_nation + 2) % 25 WHERE s_id IN (4, 9)',
  'DELETE FROM j_customer WHERE c_id = 13',
];

async function keyMap(target: string): Promise<string | null> {
  const [row] = await live.db.sql<{ kind: string | null }[]>`
    SELECT spec->>'key_map' AS kind FROM trellis.transforms WHERE target_name = ${target}`;
  return row?.kind ?? null;
}

describe('statements over a shadow joined from the changed rows outward', () => {
  it('stay exact through writes on each of six tables, by group and by delta', async () => {
    await live.define(byGroup, byDelta);
    await live.converged([byGroup, byDelta]);
    expect(await keyMap('j_revenue_groups')).toBe('shadow');
    expect(await keyMap('j_revenue_delta')).toBe('shadow');
    const modes = new Map(
      (await live.trellis.definitions()).map((d) => [d.target, d.maintenance?.mode]),
    );
    expect(modes.get('j_revenue_groups')).toBe('group');
    expect(modes.get('j_revenue_delta')).toBe('delta');
    for (const write of writes) {
      await live.db.sql.unsafe(write);
      await live.converged([byGroup, byDelta]);
    }
  });
});
