import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { keyMapOf, maintenanceOf } from './support/maintenance.js';
import type { Definition } from './support/oracle.js';
import { seededWriters } from './support/seeded-writers.js';
import { checked, corrupt } from './support/self-check.js';

/**
 * Aggregates kept by delta over a LEFT JOIN that fans out, and a grand total over a join
 * that fans out (issue #22 item 1, ADR 0067 addendum). Both keep a shadow of their sources
 * (ADR 0051) and group states (ADR 0044); a LEFT JOIN's signed rows are the join rows of
 * the FROM rows a change touches, as they were and as they are, so a NULL-extended row
 * comes and goes as its FROM row's matches empty and fill. Every target is compared with
 * its definition run by Postgres after each step.
 */
const live = livePipeline();

const chainTables = `
  CREATE TABLE lj_cust (c_id int PRIMARY KEY, c_region text, c_tier int);
  CREATE TABLE lj_orders (o_id int PRIMARY KEY, o_cust int, o_status text, o_prio int);
  CREATE TABLE lj_line (l_id int PRIMARY KEY, l_order int, l_qty int, l_price numeric, l_flag boolean);
  CREATE INDEX ON lj_orders (o_cust);
  CREATE INDEX ON lj_line (l_order);
  CREATE INDEX ON lj_cust (c_region);
  CREATE INDEX ON lj_cust (c_tier);
  CREATE INDEX ON lj_orders (o_status);
  INSERT INTO lj_cust SELECT i, 'r' || (i % 4), i % 3 FROM generate_series(1, 30) i;
  -- Customers 21..30 have no orders; orders 41..50 no line items.
  INSERT INTO lj_orders SELECT i, 1 + i % 20, CASE WHEN i % 3 = 0 THEN 'F' ELSE 'O' END, i % 5
    FROM generate_series(1, 50) i;
  INSERT INTO lj_line
    SELECT i, 1 + i % 40, i % 7, CASE WHEN i % 6 = 0 THEN NULL ELSE round(i * 0.75, 2) END, i % 4 = 0
      FROM generate_series(1, 160) i;`;

// Customers, their orders, their orders' line items, every join a LEFT JOIN: a customer
// without orders and an order without line items are NULL-extended rows, counted by
// count(*) and left out of the other aggregates.
const byRegion: Definition = {
  target: 'lj_by_region',
  from: `lj_cust c LEFT JOIN lj_orders o ON o.o_cust = c.c_id
         LEFT JOIN lj_line l ON l.l_order = o.o_id`,
  select: `c.c_region, count(*) AS n, count(o.o_id) AS orders, count(l.l_id) AS lines,
           sum(l.l_qty) AS qty, sum(l.l_price) AS revenue, avg(l.l_price) AS mean_price,
           count(*) FILTER (WHERE o.o_status = 'O') AS open_rows,
           sum(l.l_qty) FILTER (WHERE l.l_flag) AS flagged_qty,
           min(l.l_qty) AS low, max(o.o_prio) AS top_prio`,
  groupBy: 'c.c_region',
  having: 'count(l.l_id) > 8',
};

// Grouped by a column of the NULL-extended side: a NULL group comes and goes.
const byStatus: Definition = {
  target: 'lj_by_status',
  from: `lj_cust c LEFT JOIN lj_orders o ON o.o_cust = c.c_id
         LEFT JOIN lj_line l ON l.l_order = o.o_id`,
  select: 'o.o_status, c.c_tier, count(*) AS n, sum(l.l_price) AS revenue, count(l.l_qty) AS q',
  where: "c.c_region <> 'r3' OR l.l_qty IS NULL",
  groupBy: 'o.o_status, c.c_tier',
};

// A grand total over the same join, with HAVING.
const total: Definition = {
  target: 'lj_total',
  from: `lj_cust c LEFT JOIN lj_orders o ON o.o_cust = c.c_id
         LEFT JOIN lj_line l ON l.l_order = o.o_id`,
  select: `count(*) AS n, count(l.l_id) AS lines, sum(l.l_price) AS revenue,
           avg(l.l_qty) AS mean_qty, max(l.l_qty) AS most`,
  having: 'count(l.l_id) > 100',
};

describe('aggregates kept by delta over a LEFT JOIN that fans out', () => {
  it('stays exact as matches come and go, groups empty and fill, and HAVING crosses', async () => {
    await live.db.sql.unsafe(chainTables);
    const defs = [byRegion, byStatus, total];
    await live.define(...defs);
    await live.converged(defs);
    for (const d of defs) {
      expect(await keyMapOf(live.db, d.target)).toBe('shadow');
      const kept = await maintenanceOf(live.trellis, d.target);
      expect(kept?.mode).toBe('delta');
    }
    expect((await maintenanceOf(live.trellis, 'lj_by_region'))?.reason).toMatch(
      /has a LEFT JOIN.*FROM rows/,
    );
    expect(
      (await maintenanceOf(live.trellis, 'lj_by_region'))?.aggregates.map((a) => a.how),
    ).toEqual([
      'delta',
      'delta',
      'delta',
      'delta',
      'delta+rescan',
      'delta+rescan',
      'delta',
      'delta',
      'delta+rescan',
      'delta+rescan',
    ]);
    await live.steps(defs, [
      // A customer without orders gains one (its NULL-extended row goes), one without
      // line items too; then it loses them again (the NULL-extended row comes back).
      "INSERT INTO lj_orders VALUES (100, 25, 'O', 9)",
      'INSERT INTO lj_line VALUES (1000, 100, 5, 1.0, true), (1001, 100, 3, 1.00, false)',
      'DELETE FROM lj_line WHERE l_order = 100',
      'DELETE FROM lj_orders WHERE o_id = 100',
      // An order's every line item removed (it becomes NULL-extended), then one moved back.
      'DELETE FROM lj_line WHERE l_order = 3',
      'UPDATE lj_line SET l_order = 3 WHERE l_id = 5',
      // Orders moving between customers (all their line items change group), one to nobody.
      'UPDATE lj_orders SET o_cust = 22 WHERE o_id IN (4, 24); UPDATE lj_orders SET o_cust = NULL WHERE o_id = 6',
      // Values of mixed numeric scales, NULLs, the extremes removed.
      'UPDATE lj_line SET l_price = 2.500 WHERE l_id = 7; UPDATE lj_line SET l_price = NULL, l_qty = NULL WHERE l_id % 9 = 0',
      'DELETE FROM lj_line WHERE l_qty = 0',
      'UPDATE lj_orders SET o_prio = 0 WHERE o_prio = 4; UPDATE lj_orders SET o_status = NULL WHERE o_id = 8',
      // A customer changing region and tier: all its join rows move.
      "UPDATE lj_cust SET c_region = 'r3', c_tier = 7 WHERE c_id IN (1, 26)",
      // Three tables changed at once, on the same join rows.
      `DO $$ BEGIN
         UPDATE lj_cust SET c_region = 'r0' WHERE c_id = 2;
         UPDATE lj_orders SET o_cust = 2, o_status = 'F' WHERE o_id = 9;
         INSERT INTO lj_line VALUES (1002, 9, 6, 0.125, true);
         DELETE FROM lj_line WHERE l_order = 2;
       END $$`,
      // HAVING crossing out (a region's line items go) and back in; the total's too.
      "DELETE FROM lj_line WHERE l_order IN (SELECT o_id FROM lj_orders JOIN lj_cust ON c_id = o_cust WHERE c_region = 'r1')",
      "INSERT INTO lj_line SELECT 2000 + 3 * o_id + i, o_id, i % 5, i * 0.5, i % 2 = 0 FROM lj_orders JOIN lj_cust ON c_id = o_cust, generate_series(1, 3) i WHERE c_region = 'r1'",
      'DELETE FROM lj_line WHERE l_id % 2 = 0',
      'INSERT INTO lj_line SELECT 3000 + i, 1 + i % 45, i % 6, i * 0.01, true FROM generate_series(1, 90) i',
      // A region emptied (its customers deleted), then filled again without orders.
      "DELETE FROM lj_cust WHERE c_region = 'r2'",
      "INSERT INTO lj_cust VALUES (200, 'r2', 1), (201, 'r2', 2)",
      // Orders of customers that do not exist, then the customers.
      "INSERT INTO lj_orders VALUES (300, 300, 'O', 1), (301, 300, 'F', 2); INSERT INTO lj_line VALUES (4000, 300, 4, 9.99, true)",
      "INSERT INTO lj_cust VALUES (300, 'r9', 0)",
      'DELETE FROM lj_orders WHERE o_id = 300',
    ]);
    for (const d of defs) {
      expect((await live.trellis.status(d.target)).lastApply?.mode).toBe('delta');
    }
  }, 240_000);

  it('stays exact over a self LEFT JOIN whose NULL-extended rows flip', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE lj_item (id int PRIMARY KEY, cat int, v int, w numeric);
      CREATE INDEX ON lj_item (cat);
      INSERT INTO lj_item SELECT i, i % 4, i % 11, i * 0.5 FROM generate_series(1, 60) i;`);
    // Each item with the items of its category worth more: the most valuable of each
    // category has none (one NULL-extended row), until a more valuable one comes.
    const above: Definition = {
      target: 'lj_above',
      from: 'lj_item a LEFT JOIN lj_item b ON b.cat = a.cat AND b.v > a.v',
      select: `a.cat AS cat, count(*) AS n, count(b.id) AS above, sum(b.w) AS wsum,
               count(*) FILTER (WHERE b.id IS NULL) AS tops, max(b.v) AS high, min(a.v) AS low`,
      groupBy: 'a.cat',
      having: 'count(b.id) > 10',
    };
    await live.define(above);
    await live.converged(above);
    expect((await maintenanceOf(live.trellis, 'lj_above'))?.mode).toBe('delta');
    await live.steps(
      [above],
      [
        // A new top (the old tops gain a match), then gone (they lose it).
        'INSERT INTO lj_item VALUES (100, 1, 50, 1.0)',
        'DELETE FROM lj_item WHERE id = 100',
        'UPDATE lj_item SET v = v + 3 WHERE id IN (5, 6)',
        'UPDATE lj_item SET cat = 3 WHERE id IN (7, 8); UPDATE lj_item SET w = 1.000 WHERE id = 9',
        'DELETE FROM lj_item WHERE v = 10',
        'DELETE FROM lj_item WHERE cat = 2',
        'INSERT INTO lj_item VALUES (101, 2, 1, 2.25), (102, 2, 1, NULL), (103, NULL, 4, 1)',
        'UPDATE lj_item SET v = NULL WHERE id % 7 = 0',
      ],
    );
    expect((await live.trellis.status('lj_above')).lastApply?.mode).toBe('delta');
  }, 240_000);

  it('stays exact under concurrent writers on all three tables, rollbacks included', async () => {
    const seed = Number(process.env.TRELLIS_TEST_SEED ?? 22);
    console.log(`[seed] delta-left-join writers ${seed}`);
    const maybe = (r: () => number, v: string) => (r() < 0.2 ? 'NULL' : v);
    const statement = (r: () => number, w: number, i: number): string => {
      const id = 10_000 * w + i;
      const cust = 1 + Math.floor(r() * 35);
      const order = 1 + Math.floor(r() * 60);
      const price = maybe(
        r,
        (Math.floor(r() * 400) / [1, 10, 100][Math.floor(r() * 3)]!).toString(),
      );
      switch (Math.floor(r() * 9)) {
        case 0:
          return `INSERT INTO lj_line VALUES (${id}, ${order}, ${maybe(r, String(Math.floor(r() * 8)))}, ${price}, ${r() < 0.5})`;
        case 1:
          return `DELETE FROM lj_line WHERE l_order = ${order}`;
        case 2:
          return `UPDATE lj_line SET l_order = ${order}, l_price = ${price} WHERE l_id % 23 = ${order % 23}`;
        case 3:
          return `INSERT INTO lj_orders VALUES (${id}, ${cust}, ${r() < 0.5 ? "'O'" : "'F'"}, ${Math.floor(r() * 6)}) ON CONFLICT DO NOTHING`;
        case 4:
          return `UPDATE lj_orders SET o_cust = ${maybe(r, String(cust))} WHERE o_id = ${order}`;
        case 5:
          return `DELETE FROM lj_orders WHERE o_id = ${order}`;
        case 6:
          return `INSERT INTO lj_cust VALUES (${cust}, 'r${Math.floor(r() * 5)}', ${Math.floor(r() * 3)}) ON CONFLICT (c_id) DO UPDATE SET c_region = EXCLUDED.c_region`;
        case 7:
          return `DELETE FROM lj_cust WHERE c_id = ${cust}`;
        default:
          return `UPDATE lj_cust SET c_tier = ${Math.floor(r() * 3)}, c_region = 'r${Math.floor(r() * 4)}' WHERE c_id % 9 = ${cust % 9}`;
      }
    };
    await seededWriters(live.db.sql, seed, statement);
    await live.converged([byRegion, byStatus, total]);
  }, 240_000);
});

describe('a grand total over a join that fans out', () => {
  it('is kept by delta, exact through writes, HAVING crossing both ways', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE gt_item (id int PRIMARY KEY, cat int, v int, w numeric);
      CREATE INDEX ON gt_item (cat);
      INSERT INTO gt_item SELECT i, i % 5, i % 13, i * 0.25 FROM generate_series(1, 80) i;`);
    const pairs: Definition = {
      target: 'gt_pairs',
      from: 'gt_item a JOIN gt_item b ON b.cat = a.cat',
      select: `count(*) AS pairs, sum(b.v) AS total, sum(a.w) AS wsum, avg(b.w) AS wmean,
               min(a.v) AS low, count(*) FILTER (WHERE a.id < b.id) AS ordered`,
      where: 'a.v <> 12 OR b.v <> 12',
      having: 'count(*) > 1200',
    };
    await live.define(pairs);
    await live.converged(pairs);
    expect(await keyMapOf(live.db, 'gt_pairs')).toBe('shadow');
    const kept = await maintenanceOf(live.trellis, 'gt_pairs');
    expect(kept?.mode).toBe('delta');
    expect(kept?.reason).toMatch(/signed from the sources' shadow/);
    await live.steps(
      [pairs],
      [
        'UPDATE gt_item SET v = v + 1 WHERE id = 3',
        'UPDATE gt_item SET cat = 1 WHERE id IN (4, 9)',
        'UPDATE gt_item SET w = 1.000 WHERE id = 10; UPDATE gt_item SET w = NULL WHERE id = 11',
        'DELETE FROM gt_item WHERE v = 0',
        // HAVING out (the pairs fall under 1200), then back in.
        'DELETE FROM gt_item WHERE cat = 2',
        'INSERT INTO gt_item SELECT i, 2, i % 13, i FROM generate_series(500, 520) i',
        // Emptied, then filled again.
        'DELETE FROM gt_item',
        'INSERT INTO gt_item VALUES (900, 4, 5, 2.25), (901, 4, 7, NULL), (902, NULL, 1, 1)',
      ],
    );
    expect((await live.trellis.status('gt_pairs')).lastApply?.mode).toBe('delta');
  }, 240_000);
});

describe('the self-check over these shapes', () => {
  it('finds them consistent, repairs a corrupted group and grand total, and deltas go on exact', async () => {
    const defs = [byRegion, byStatus, total];
    // The writers before may leave the grand total under its HAVING (an empty target, so
    // nothing to corrupt): enough lines of one customer's order bring it back over.
    await live.steps(defs, [
      `INSERT INTO lj_line SELECT 50000 + i, (SELECT min(o_id) FROM lj_orders JOIN lj_cust ON c_id = o_cust),
              i % 4, 1.5, true FROM generate_series(1, 120) i`,
    ]);
    expect(await live.db.sql`SELECT 1 FROM lj_total`).toHaveLength(1);
    for (const d of defs) {
      expect((await checked(live.trellis, d.target)).report?.outcome).toBe('consistent');
    }
    await corrupt(
      live.db,
      'lj_by_region',
      // A group the target holds (the concurrent writers before leave any regions).
      `UPDATE lj_by_region SET n = n + 1, revenue = coalesce(revenue, 0) + 1
        WHERE c_region IS NOT DISTINCT FROM (SELECT min(c_region) FROM lj_by_region)`,
    );
    await corrupt(live.db, 'lj_total', 'UPDATE lj_total SET lines = lines + 5');
    for (const target of ['lj_by_region', 'lj_total']) {
      const found = await checked(live.trellis, target);
      expect(found.report?.outcome).toBe('diverged');
      await checked(live.trellis, target, { repair: true });
      expect((await checked(live.trellis, target)).report?.outcome).toBe('consistent');
    }
    await live.converged(defs);
    await live.steps(defs, [
      "UPDATE lj_line SET l_price = l_price * 2 WHERE l_order IN (SELECT o_id FROM lj_orders WHERE o_cust IN (SELECT c_id FROM lj_cust WHERE c_region = 'r0'))",
      'DELETE FROM lj_orders WHERE o_id % 5 = 0',
    ]);
  }, 240_000);
});

describe('what a change costs, and the fallbacks', () => {
  it("applies one changed row from its FROM row's join rows, not its group's", async () => {
    // An aggregate input that counts its evaluations: a group recompute evaluates it for
    // every join row of the groups it touches, a delta for the touched FROM rows' join rows.
    await live.db.sql.unsafe(`
      CREATE SEQUENCE lc_reads;
      CREATE FUNCTION lc_counted(v int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
        $$ BEGIN PERFORM nextval('lc_reads'); RETURN v; END $$;
      CREATE TABLE lc_cust (id int PRIMARY KEY, region int);
      CREATE TABLE lc_orders (id int PRIMARY KEY, cust int);
      CREATE TABLE lc_line (id int PRIMARY KEY, ord int, qty int);
      CREATE INDEX ON lc_cust (region);
      CREATE INDEX ON lc_orders (cust);
      CREATE INDEX ON lc_line (ord);
      -- 2 regions of 20 customers, 3 orders each, 5 line items each: 300 join rows a region.
      INSERT INTO lc_cust SELECT i, i % 2 FROM generate_series(1, 40) i;
      INSERT INTO lc_orders SELECT i, 1 + i % 40 FROM generate_series(1, 120) i;
      INSERT INTO lc_line SELECT i, 1 + i % 120, i % 9 FROM generate_series(1, 600) i;
      CREATE TABLE lc_cust2 (LIKE lc_cust INCLUDING ALL);
      CREATE TABLE lc_orders2 (LIKE lc_orders INCLUDING ALL);
      CREATE TABLE lc_line2 (LIKE lc_line INCLUDING ALL);
      INSERT INTO lc_cust2 SELECT * FROM lc_cust;
      INSERT INTO lc_orders2 SELECT * FROM lc_orders;
      INSERT INTO lc_line2 SELECT * FROM lc_line;
      CREATE TABLE lc_gt (LIKE lc_line INCLUDING ALL);
      INSERT INTO lc_gt SELECT * FROM lc_line;
      CREATE TABLE lc_gt2 (LIKE lc_line INCLUDING ALL);
      INSERT INTO lc_gt2 SELECT * FROM lc_line;`);
    const byDelta: Definition = {
      target: 'lc_cheap',
      from: `lc_cust c LEFT JOIN lc_orders o ON o.cust = c.id LEFT JOIN lc_line l ON l.ord = o.id`,
      select: 'c.region, count(*) AS n, sum(lc_counted(l.qty)) AS qty',
      groupBy: 'c.region',
    };
    // The same with a DISTINCT aggregate: no exact delta, so the group recompute.
    const byGroup: Definition = {
      target: 'lc_dear',
      from: `lc_cust2 c LEFT JOIN lc_orders2 o ON o.cust = c.id LEFT JOIN lc_line2 l ON l.ord = o.id`,
      select: 'c.region, count(DISTINCT l.qty) AS kinds, sum(lc_counted(l.qty)) AS qty',
      groupBy: 'c.region',
    };
    // A grand total over a self-join (5 classes of 120 rows: 35,700 join rows), and the
    // same with a DISTINCT aggregate: recomputed whole.
    const grand: Definition = {
      target: 'lc_grand',
      from: 'lc_gt a JOIN lc_gt b ON b.ord % 5 = a.ord % 5 AND b.id > a.id',
      select: 'count(*) AS n, sum(lc_counted(b.qty)) AS qty',
    };
    const grandWhole: Definition = {
      target: 'lc_grand_whole',
      from: 'lc_gt2 a JOIN lc_gt2 b ON b.ord % 5 = a.ord % 5 AND b.id > a.id',
      select: 'count(DISTINCT a.qty) AS kinds, sum(lc_counted(b.qty)) AS qty',
    };
    const all = [byDelta, byGroup, grand, grandWhole];
    await live.define(...all);
    await live.converged(all);
    expect((await maintenanceOf(live.trellis, 'lc_cheap'))?.mode).toBe('delta');
    expect((await maintenanceOf(live.trellis, 'lc_grand'))?.mode).toBe('delta');
    const dearKept = await maintenanceOf(live.trellis, 'lc_dear');
    expect(dearKept?.mode).toBe('group');
    expect(dearKept?.aggregates.map((a) => a.how)).toEqual(['recompute', 'recompute']);
    // EXPLAIN TRANSFORM says the same, per aggregate.
    const explained = await live.trellis.explain('lc_cheap');
    expect(explained.parts[0]?.mode).toBe('delta');
    expect(explained.parts[0]?.aggregates.map((a) => a.how)).toEqual(['delta', 'delta']);
    const reads = async () => {
      const [row] = await live.db.sql<{ n: string }[]>`SELECT last_value AS n FROM lc_reads`;
      return Number(row!.n);
    };
    // Each transform reads tables of its own: only its drain evaluates after its write.
    const evaluations = async (target: string, write: string) => {
      const before = await reads();
      await live.db.sql.unsafe(write);
      const token = await live.trellis.watermarkToken();
      await live.trellis.awaitConverged(target, token, { timeoutMs: 25_000 });
      return (await reads()) - before;
    };
    // One line item's quantity changed: its customer has 15 join rows, before and after.
    const cheap = await evaluations('lc_cheap', 'UPDATE lc_line SET qty = qty + 100 WHERE id = 7');
    const dear = await evaluations('lc_dear', 'UPDATE lc_line2 SET qty = qty + 100 WHERE id = 7');
    // One row of 600 changed in the grand total: 2 × its ~120 pairs, not the 72,000.
    const total = await evaluations('lc_grand', 'UPDATE lc_gt SET qty = qty + 100 WHERE id = 7');
    const whole = await evaluations(
      'lc_grand_whole',
      'UPDATE lc_gt2 SET qty = qty + 100 WHERE id = 7',
    );
    await live.converged(all);
    expect((await live.trellis.status('lc_cheap')).lastApply?.mode).toBe('delta');
    expect((await live.trellis.status('lc_grand')).lastApply?.mode).toBe('delta');
    console.log(
      `[cost] one row changed: left join by delta ${cheap}, by group ${dear}; grand total by delta ${total}, whole ${whole}`,
    );
    expect(cheap).toBeGreaterThan(0);
    expect(cheap).toBeLessThanOrEqual(2 * 2 * 15);
    expect(dear).toBeGreaterThanOrEqual(300);
    expect(total).toBeGreaterThan(0);
    expect(total).toBeLessThanOrEqual(2 * 2 * 120);
    expect(whole).toBeGreaterThanOrEqual(35_700);
  }, 240_000);

  it('keeps a float sum over a LEFT JOIN that fans out by group recompute, exact, and says why', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE lf_a (id int PRIMARY KEY, cat int);
      CREATE TABLE lf_b (id int PRIMARY KEY, a_id int, x float8, n int);
      CREATE TABLE lf_c (id int PRIMARY KEY, b_id int, y int);
      INSERT INTO lf_a SELECT i, i % 3 FROM generate_series(1, 12) i;
      INSERT INTO lf_b SELECT i, 1 + i % 10, i * 0.1, i FROM generate_series(1, 30) i;
      INSERT INTO lf_c SELECT i, 1 + i % 25, i FROM generate_series(1, 60) i;`);
    const floats: Definition = {
      target: 'lf_floats',
      from: 'lf_a a LEFT JOIN lf_b b ON b.a_id = a.id LEFT JOIN lf_c c ON c.b_id = b.id',
      select: 'a.cat, count(*) AS n, sum(b.x) AS xs, sum(c.y) AS ys',
      groupBy: 'a.cat',
    };
    await live.define(floats);
    await live.converged(floats);
    const kept = await maintenanceOf(live.trellis, 'lf_floats');
    expect(kept?.mode).toBe('group');
    expect(kept?.aggregates.map((a) => a.how)).toEqual(['recompute', 'recompute', 'recompute']);
    expect(kept?.aggregates[1]?.why).toMatch(/not exact for this type/);
    await live.steps(
      [floats],
      [
        'UPDATE lf_b SET x = x * 3 WHERE id % 4 = 0',
        'DELETE FROM lf_b WHERE a_id = 1',
        'INSERT INTO lf_b VALUES (100, 1, 0.3, 1); DELETE FROM lf_c WHERE y > 50',
      ],
    );
    expect((await live.trellis.status('lf_floats')).lastApply?.mode).not.toBe('delta');
  }, 240_000);
});
