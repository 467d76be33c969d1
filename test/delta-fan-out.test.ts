import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type LoggedLine, recordingLogger } from './support/logging.js';
import { keyMapOf, maintenanceOf } from './support/maintenance.js';
import type { Definition } from './support/oracle.js';

/**
 * Aggregates kept by delta over a join that fans out (issue #22 item 1, ADR 0067): such a
 * GROUP BY keeps a shadow of its sources (ADR 0051), and a change's signed join rows are
 * found from it by the delta rule of a join, then folded into the group states (ADR 0044).
 * Every target is compared with its definition run by Postgres after each step, through
 * writes on every joined table.
 */
const logged: LoggedLine[] = [];
const live = livePipeline({ logger: recordingLogger(logged) });

describe('aggregates kept by delta over a join that fans out', () => {
  it('stays exact over customers, orders, line items and parts through writes on each', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE f_customer (c_id int PRIMARY KEY, c_region text);
      CREATE TABLE f_orders (o_id int PRIMARY KEY, o_cust int, o_status text);
      CREATE TABLE f_lineitem (l_id int PRIMARY KEY, l_order int, l_part int, l_qty int,
                               l_price numeric, l_disc numeric, l_flag boolean);
      CREATE TABLE f_part (p_id int PRIMARY KEY, p_brand text, p_size int);
      CREATE INDEX ON f_orders (o_cust);
      CREATE INDEX ON f_lineitem (l_order);
      CREATE INDEX ON f_lineitem (l_part);
      INSERT INTO f_customer SELECT i, 'r' || (i % 3) FROM generate_series(1, 20) i;
      INSERT INTO f_orders SELECT i, 1 + i % 20, CASE WHEN i % 4 = 0 THEN 'F' ELSE 'O' END
        FROM generate_series(1, 80) i;
      INSERT INTO f_part SELECT i, 'b' || (i % 4), i % 7 FROM generate_series(1, 30) i;
      INSERT INTO f_lineitem
        SELECT i, 1 + i % 80, 1 + i % 30, i % 9, round(i * 1.25, 2),
               CASE WHEN i % 5 = 0 THEN NULL ELSE (i % 10) / 100.0 END, i % 3 = 0
          FROM generate_series(1, 400) i;`);
    const sales: Definition = {
      target: 'f_sales',
      from: `f_customer c JOIN f_orders o ON o.o_cust = c.c_id
             JOIN f_lineitem l ON l.l_order = o.o_id
             JOIN f_part p ON p.p_id = l.l_part`,
      select: `c.c_region, p.p_brand, count(*) AS n, sum(l.l_qty) AS qty,
               sum(l.l_price) AS revenue, avg(l.l_disc) AS mean_disc,
               count(l.l_disc) FILTER (WHERE l.l_flag) AS flagged,
               sum(l.l_price * (1 - l.l_disc)) FILTER (WHERE o.o_status = 'O') AS open_net,
               min(l.l_qty) AS low, max(p.p_size) AS biggest`,
      where: 'l.l_qty > 0',
      groupBy: 'c.c_region, p.p_brand',
      having: 'sum(l.l_qty) > 30',
    };
    await live.define(sales);
    await live.converged(sales);
    expect(await keyMapOf(live.db, 'f_sales')).toBe('shadow');
    const kept = await maintenanceOf(live.trellis, 'f_sales');
    expect(kept?.mode).toBe('delta');
    expect(kept?.reason).toMatch(/signed from the sources' shadow/);
    expect(kept?.aggregates.map((a) => a.how)).toEqual([
      'delta',
      'delta',
      'delta+rescan',
      'delta+rescan',
      'delta',
      'delta+rescan',
      'delta+rescan',
      'delta+rescan',
    ]);
    await live.steps(
      [sales],
      [
        // Aggregated values, of mixed numeric scales, and NULLs.
        'UPDATE f_lineitem SET l_price = 1.000 WHERE l_id = 7; UPDATE f_lineitem SET l_price = 2.50000 WHERE l_id = 8',
        'DELETE FROM f_lineitem WHERE l_id = 8',
        'UPDATE f_lineitem SET l_disc = NULL, l_flag = NULL WHERE l_id % 11 = 0',
        // A line item moving to another order, another part (between groups).
        'UPDATE f_lineitem SET l_order = 3 WHERE l_id = 10; UPDATE f_lineitem SET l_part = 2 WHERE l_id = 11',
        // An order moving to another customer (all its line items change group); its status.
        "UPDATE f_orders SET o_cust = 2 WHERE o_id = 5; UPDATE f_orders SET o_status = 'F' WHERE o_id = 6",
        // A customer changing region; a part changing brand and size (extremes).
        "UPDATE f_customer SET c_region = 'r9' WHERE c_id = 4",
        "UPDATE f_part SET p_brand = 'b0', p_size = 40 WHERE p_id = 3",
        'UPDATE f_part SET p_size = 0 WHERE p_id = 3',
        // Two joined tables changed at once, on the same join rows.
        "DO $$ BEGIN UPDATE f_orders SET o_cust = 7 WHERE o_id = 9; UPDATE f_lineitem SET l_qty = 8 WHERE l_order = 9; UPDATE f_customer SET c_region = 'r1' WHERE c_id = 7; END $$",
        // Extremes deleted: the group is folded again from the join after the change.
        'DELETE FROM f_lineitem WHERE l_qty = 1',
        'UPDATE f_lineitem SET l_qty = 0 WHERE l_qty = 8',
        // HAVING crossing out and back in.
        "UPDATE f_lineitem SET l_qty = 1 WHERE l_part IN (SELECT p_id FROM f_part WHERE p_brand = 'b1')",
        "UPDATE f_lineitem SET l_qty = 6 WHERE l_part IN (SELECT p_id FROM f_part WHERE p_brand = 'b1')",
        // A group emptied (its customers deleted), then filled again.
        "DELETE FROM f_customer WHERE c_region = 'r2'",
        "INSERT INTO f_customer VALUES (102, 'r2'), (105, 'r2'); UPDATE f_orders SET o_cust = 102 WHERE o_id < 20",
        // Rows joining nothing, then something.
        'INSERT INTO f_lineitem VALUES (1000, 999, 1, 5, 3.3, 0.1, true), (1001, 1, 999, 5, 3.3, 0.1, true)',
        "INSERT INTO f_orders VALUES (999, 1, 'O'); INSERT INTO f_part VALUES (999, 'b9', 99)",
        'DELETE FROM f_part WHERE p_id = 999; DELETE FROM f_orders WHERE o_id = 999',
      ],
    );
    expect((await live.trellis.status('f_sales')).lastApply?.mode).toBe('delta');
  });

  it('stays exact over a self-join that multiplies rows', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE f_item (id int PRIMARY KEY, cat int, v int, w numeric);
      CREATE INDEX ON f_item (cat);
      INSERT INTO f_item SELECT i, i % 5, i % 13, i * 0.5 FROM generate_series(1, 120) i;`);
    const pairs: Definition = {
      target: 'f_pairs',
      from: 'f_item a JOIN f_item b ON b.cat = a.cat',
      select: `a.cat AS cat, count(*) AS pairs, sum(b.v) AS total, sum(a.w) AS wsum,
               avg(b.w) AS wmean, min(a.v) AS low, max(b.v) AS high,
               count(*) FILTER (WHERE a.id < b.id) AS ordered`,
      where: 'a.v <> 12 OR b.v <> 12',
      groupBy: 'a.cat',
      having: 'count(*) > 30',
    };
    const byBoth: Definition = {
      target: 'f_by_both',
      from: 'f_item a JOIN f_item b ON b.cat = a.cat AND b.id <> a.id',
      select: 'a.v AS av, b.cat AS bcat, count(*) AS n, sum(a.w + b.w) AS w',
      groupBy: 'a.v, b.cat',
    };
    await live.define(pairs, byBoth);
    await live.converged([pairs, byBoth]);
    expect((await maintenanceOf(live.trellis, 'f_pairs'))?.mode).toBe('delta');
    expect((await maintenanceOf(live.trellis, 'f_by_both'))?.mode).toBe('delta');
    await live.steps(
      [pairs, byBoth],
      [
        'UPDATE f_item SET v = v + 1 WHERE id = 3',
        // Moving between categories: a row's pairs on both sides.
        'UPDATE f_item SET cat = 1 WHERE id IN (4, 9)',
        'UPDATE f_item SET w = 1.000 WHERE id = 10; UPDATE f_item SET w = NULL WHERE id = 11',
        // Extremes gone; HAVING crossing out (a category shrinks) and back.
        'DELETE FROM f_item WHERE v IN (0, 12)',
        'DELETE FROM f_item WHERE cat = 2 AND id > 20',
        'INSERT INTO f_item SELECT i, 2, i % 13, i FROM generate_series(500, 520) i',
        // A category emptied, then filled again; a new one.
        'DELETE FROM f_item WHERE cat = 4',
        'INSERT INTO f_item VALUES (900, 4, 5, 2.25), (901, 4, 7, NULL), (902, 6, 1, 1)',
        'INSERT INTO f_item VALUES (903, NULL, 1, 1), (904, NULL, 2, 2)',
      ],
    );
    expect((await live.trellis.status('f_pairs')).lastApply?.mode).toBe('delta');
  });

  it('recomputes a burst when cheaper (shadow and states filled again), and deltas go on exact after', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE f_burst (id int PRIMARY KEY, cat int, v numeric);
      CREATE INDEX ON f_burst (cat);
      INSERT INTO f_burst SELECT i, i % 40, i * 0.25 FROM generate_series(1, 2000) i;
      ANALYZE f_burst;`);
    const d: Definition = {
      target: 'f_burst_pairs',
      from: 'f_burst a JOIN f_burst b ON b.cat = a.cat',
      select: 'a.cat AS cat, count(*) AS n, sum(b.v) AS total, max(a.id) AS high',
      groupBy: 'a.cat',
    };
    await live.define(d);
    await live.converged(d);
    expect((await maintenanceOf(live.trellis, d.target))?.mode).toBe('delta');
    await live.trellis.apply(`PAUSE TRANSFORM ${d.target}`);
    // What each way has cost it before, as if measured: a delta dear per key, a recompute cheap.
    await live.db
      .sql`UPDATE trellis.pipeline p SET apply_costs = '{"delta": 5, "recompute": 0.0001}'
             FROM trellis.transforms t WHERE t.id = p.transform_id AND t.target_name = ${d.target}`;
    await live.db.sql.unsafe(`
      UPDATE f_burst SET v = v + 1, cat = cat + 1 WHERE id % 3 <> 0;
      DELETE FROM f_burst WHERE id % 7 = 0;
      INSERT INTO f_burst SELECT i, i % 45, i FROM generate_series(3000, 3100) i;`);
    const resumedAt = Date.now();
    await live.trellis.apply(`RESUME TRANSFORM ${d.target}`);
    await live.converged(d);
    const modes = logged
      .filter(
        (l) => l.at >= resumedAt && l.obj.target === d.target && typeof l.obj.keys === 'number',
      )
      .map((l) => l.obj.mode);
    expect(modes).toContain('recompute');
    await live.db.sql`UPDATE trellis.pipeline p SET apply_costs = NULL
             FROM trellis.transforms t WHERE t.id = p.transform_id AND t.target_name = ${d.target}`;
    await live.steps(
      [d],
      [
        'UPDATE f_burst SET v = 10000 WHERE id = 1',
        'DELETE FROM f_burst WHERE id = 1',
        'UPDATE f_burst SET cat = 99 WHERE id IN (2, 4)',
      ],
    );
    expect((await live.trellis.status(d.target)).lastApply?.mode).toBe('delta');
  });

  it("applies one changed row without reading its groups' other rows", async () => {
    // An aggregate input that counts its evaluations: a group recompute evaluates it for
    // every join row of the groups it touches, a delta for the changed rows' join rows.
    await live.db.sql.unsafe(`
      CREATE SEQUENCE f_reads;
      CREATE FUNCTION f_counted(v int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
        $$ BEGIN PERFORM nextval('f_reads'); RETURN v; END $$;
      CREATE TABLE f_big (id int PRIMARY KEY, cat int, v int);
      CREATE INDEX ON f_big (cat);
      INSERT INTO f_big SELECT i, i % 2, i FROM generate_series(1, 60) i;
      CREATE TABLE f_big2 (LIKE f_big INCLUDING ALL);
      INSERT INTO f_big2 SELECT * FROM f_big;`);
    // 30 rows per category: 900 join rows per group.
    const byDelta: Definition = {
      target: 'f_cheap',
      from: 'f_big a JOIN f_big b ON b.cat = a.cat',
      select: 'a.cat AS cat, count(*) AS n, sum(f_counted(b.v)) AS total',
      groupBy: 'a.cat',
    };
    const byGroup: Definition = {
      target: 'f_dear',
      from: 'f_big2 a JOIN f_big2 b ON b.cat = a.cat',
      select: 'a.cat AS cat, count(DISTINCT b.v) AS kinds, sum(f_counted(b.v)) AS total',
      groupBy: 'a.cat',
    };
    await live.define(byDelta, byGroup);
    await live.converged([byDelta, byGroup]);
    expect((await maintenanceOf(live.trellis, 'f_cheap'))?.mode).toBe('delta');
    expect((await maintenanceOf(live.trellis, 'f_dear'))?.mode).toBe('group');
    const reads = async () => {
      const [row] = await live.db.sql<{ n: string }[]>`SELECT last_value AS n FROM f_reads`;
      return Number(row!.n);
    };
    // Each transform reads a table of its own: only its drain evaluates after its write.
    const evaluations = async (target: string, write: string) => {
      const before = await reads();
      await live.db.sql.unsafe(write);
      const token = await live.trellis.watermarkToken();
      await live.trellis.awaitConverged(target, token, { timeoutMs: 25_000 });
      return (await reads()) - before;
    };
    // One row's value changed: 30 join rows before, 30 after, on each side of the self-join.
    const cheap = await evaluations('f_cheap', 'UPDATE f_big SET v = v + 100 WHERE id = 7');
    const dear = await evaluations('f_dear', 'UPDATE f_big2 SET v = v + 100 WHERE id = 7');
    await live.converged([byDelta, byGroup]);
    expect((await live.trellis.status('f_cheap')).lastApply?.mode).toBe('delta');
    // The delta evaluates the changed row's signed join rows (120), never the group's 900.
    expect(cheap).toBeGreaterThan(0);
    expect(cheap).toBeLessThanOrEqual(2 * 120);
    expect(dear).toBeGreaterThanOrEqual(900);
  });

  it('keeps a LEFT JOIN that fans out by delta too (ADR 0067, addendum), and says how', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE f_l (id int PRIMARY KEY, cat int, v int);
      INSERT INTO f_l SELECT i, i % 3, i FROM generate_series(1, 30) i;`);
    const left: Definition = {
      target: 'f_left',
      from: 'f_l a LEFT JOIN f_l b ON b.cat = a.cat AND b.v > 20',
      select: 'a.cat AS cat, count(b.id) AS n, sum(b.v) AS total',
      groupBy: 'a.cat',
    };
    await live.define(left);
    const kept = await maintenanceOf(live.trellis, 'f_left');
    expect(kept?.mode).toBe('delta');
    expect(kept?.reason).toMatch(
      /has a LEFT JOIN, so a change's join rows are those of the FROM rows/,
    );
    // Every match of a category gone (NULL-extended rows), then back.
    await live.steps(
      [left],
      [
        'UPDATE f_l SET v = 25 WHERE id = 2',
        'DELETE FROM f_l WHERE v > 27',
        'UPDATE f_l SET v = 1 WHERE v > 20',
        'UPDATE f_l SET v = 21 WHERE id % 4 = 0',
      ],
    );
    expect((await live.trellis.status('f_left')).lastApply?.mode).toBe('delta');
  });
});
