import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition } from './support/oracle.js';
import { scrape } from './support/prometheus.js';
import { checked, corrupt } from './support/self-check.js';

// Self-check (issue #11): a target compared with its definition recomputed from the
// sources reports exactly what differs, by kind, key and column; repair puts it right.

const live = livePipeline();

describe('self-check findings', () => {
  it('a consistent projection is consistent, and every row is compared', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE fa_items (id int PRIMARY KEY, name text NOT NULL, price numeric NOT NULL, qty int);
      INSERT INTO fa_items SELECT i, 'item ' || i, i * 1.5, i % 9 FROM generate_series(1, 3000) i;`);
    const d: Definition = {
      target: 'fa_totals',
      from: 'fa_items',
      select: 'name, price * qty AS total',
      implicit: 'id',
    };
    await live.define(d);
    await live.converged(d);
    const job = await checked(live.trellis, d.target);
    expect(job).toMatchObject({ state: 'done', target: d.target, mode: 'full', error: null });
    expect(job.report).toMatchObject({
      outcome: 'consistent',
      divergences: [],
      counts: { missing: 0, extra: 0, differs: 0 },
      rowsCompared: 3000,
      truncated: false,
      heldKeys: { count: 0, oldestPoisonedAt: null },
      unsettledKeys: 0,
      drainFailures: [],
      repaired: null,
    });
    expect(job.rowsCompared).toBe(3000);
  });

  it('reports rows deleted, changed and added behind the engine by kind, key and column; repair puts them right', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE fb_items (id int PRIMARY KEY, name text NOT NULL, price numeric NOT NULL, qty int);
      INSERT INTO fb_items SELECT i, 'item ' || i, i * 1.5, i % 9 FROM generate_series(1, 500) i;`);
    const d: Definition = {
      target: 'fb_totals',
      from: 'fb_items',
      select: 'name, price * qty AS total',
      implicit: 'id',
    };
    await live.define(d);
    await live.converged(d);
    await corrupt(
      live.db,
      d.target,
      `DELETE FROM fb_totals WHERE id = 5;
       UPDATE fb_totals SET total = total + 1 WHERE id = 7;
       UPDATE fb_totals SET name = 'renamed', total = NULL WHERE id = 9;
       INSERT INTO fb_totals (id, name, total) VALUES (5000, 'ghost', 1);`,
    );
    const found = await checked(live.trellis, d.target);
    expect(found.state).toBe('done');
    expect(found.report?.outcome).toBe('diverged');
    expect(found.report?.counts).toEqual({ missing: 1, extra: 1, differs: 2 });
    expect(found.report?.rowsCompared).toBe(501);
    expect(found.report?.divergences).toEqual([
      { kind: 'missing', key: '5' },
      { kind: 'extra', key: '5000' },
      {
        kind: 'differs',
        key: '7',
        columns: [{ column: 'total', target: '74.5', recomputed: '73.5' }],
      },
      {
        kind: 'differs',
        key: '9',
        columns: [
          { column: 'name', target: 'renamed', recomputed: 'item 9' },
          { column: 'total', target: null, recomputed: '0.0' },
        ],
      },
    ]);

    const capped = await checked(live.trellis, d.target, { maxFindings: 2 });
    expect(capped.report?.divergences).toHaveLength(2);
    expect(capped.report?.truncated).toBe(true);
    expect(capped.report?.counts).toEqual({ missing: 1, extra: 1, differs: 2 });

    const repaired = await checked(live.trellis, d.target, { repair: true });
    expect(repaired.report?.outcome).toBe('diverged');
    expect(repaired.report?.repaired).toEqual({ findings: 4 });
    const again = await checked(live.trellis, d.target);
    expect(again.report?.outcome).toBe('consistent');
    await expectMatchesDefinition(live.db.sql, d);

    // The checks ran on this process's drain worker, and its metrics counted them.
    const metrics = await scrape();
    const labels = { target: d.target };
    expect(metrics.sum('trellis_self_checks_total', { ...labels, outcome: 'diverged' })).toBe(3);
    expect(metrics.sum('trellis_self_checks_total', { ...labels, outcome: 'consistent' })).toBe(1);
    expect(
      metrics.sum('trellis_self_check_divergences_total', { ...labels, kind: 'differs' }),
    ).toBe(6);
  });

  it('finds missing, extra and changed groups of a GROUP BY, and repairs them', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE fc_orders (id int PRIMARY KEY, customer int NOT NULL, amount numeric NOT NULL);
      CREATE INDEX ON fc_orders (customer);
      INSERT INTO fc_orders SELECT i, i % 40, i FROM generate_series(1, 2000) i;`);
    const d: Definition = {
      target: 'fc_totals',
      from: 'fc_orders',
      select: 'customer, count(*) AS n, sum(amount) AS total',
      groupBy: 'customer',
    };
    await live.define(d);
    await live.converged(d);
    await corrupt(
      live.db,
      d.target,
      `DELETE FROM fc_totals WHERE customer = 3;
       UPDATE fc_totals SET n = n + 1 WHERE customer = 4;
       INSERT INTO fc_totals (customer, n, total) VALUES (999, 1, 1);`,
    );
    const found = await checked(live.trellis, d.target);
    expect(found.report?.counts).toEqual({ missing: 1, extra: 1, differs: 1 });
    expect(found.report?.divergences).toEqual([
      { kind: 'missing', key: '3' },
      { kind: 'differs', key: '4', columns: [{ column: 'n', target: '51', recomputed: '50' }] },
      { kind: 'extra', key: '999' },
    ]);
    const repaired = await checked(live.trellis, d.target, { repair: true });
    expect(repaired.report?.repaired).toEqual({ findings: 3 });
    expect((await checked(live.trellis, d.target)).report?.outcome).toBe('consistent');
    await expectMatchesDefinition(live.db.sql, d);
  });

  it('finds rows of a left join by their composite keys, NULL sides included, and repairs them', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE fd_customers (id int PRIMARY KEY, name text NOT NULL);
      CREATE TABLE fd_orders (id int PRIMARY KEY, customer int, amount int NOT NULL);
      CREATE INDEX ON fd_orders (customer);
      INSERT INTO fd_customers SELECT i, 'c' || i FROM generate_series(1, 20) i;
      INSERT INTO fd_orders SELECT i, nullif(i % 25, 0), i FROM generate_series(1, 300) i;`);
    const d: Definition = {
      target: 'fd_lines',
      from: 'fd_orders o LEFT JOIN fd_customers c ON c.id = o.customer',
      select: 'o.amount, c.name',
      implicit: 'o.id AS id, c.id AS c_id',
    };
    await live.define(d);
    await live.converged(d);
    await corrupt(
      live.db,
      d.target,
      `DELETE FROM fd_lines WHERE id = 12;
       DELETE FROM fd_lines WHERE id = 21;
       UPDATE fd_lines SET name = 'x' WHERE id = 30;`,
    );
    const found = await checked(live.trellis, d.target);
    expect(found.report?.divergences).toEqual([
      { kind: 'missing', key: '{12,12}' },
      { kind: 'missing', key: '{21,NULL}' },
      {
        kind: 'differs',
        key: '{30,5}',
        columns: [{ column: 'name', target: 'x', recomputed: 'c5' }],
      },
    ]);
    await checked(live.trellis, d.target, { repair: true });
    expect((await checked(live.trellis, d.target)).report?.outcome).toBe('consistent');
    await expectMatchesDefinition(live.db.sql, d);
  });

  it('leaves out the rows held keys route to, reporting the held keys instead, and skips paused columns', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE fe_items (id int PRIMARY KEY, a numeric NOT NULL, b numeric NOT NULL, c text NOT NULL);
      INSERT INTO fe_items SELECT i, i * 10, 2, 'c' || i FROM generate_series(1, 200) i;`);
    const d: Definition = {
      target: 'fe_ratios',
      from: 'fe_items',
      select: 'a / b AS ratio, c',
      implicit: 'id',
    };
    await live.define(d);
    // Row 7's ratio now fails: the key is held at fe_ratios.ratio, and its recomputation
    // fails too, so the check must not recompute it.
    await live.db.sql`UPDATE fe_items SET b = 0 WHERE id = 7`;
    await live.trellis.awaitConverged(d.target, await live.trellis.watermarkToken(), {
      timeoutMs: 20_000,
    });
    expect((await live.trellis.status(d.target)).heldKeys).toBe(1);
    const held = await checked(live.trellis, d.target);
    expect(held.state).toBe('done');
    expect(held.report).toMatchObject({
      outcome: 'consistent',
      divergences: [],
      rowsCompared: 199,
    });
    expect(held.report?.heldKeys.count).toBe(1);
    expect(held.report?.heldKeys.oldestPoisonedAt).toBeInstanceOf(Date);

    // A paused column keeps its values by design: not compared.
    await live.trellis.apply('PAUSE TRANSFORM fe_ratios.c');
    await live.db.sql`UPDATE fe_items SET c = 'changed' WHERE id = 3`;
    await live.trellis.awaitConverged(d.target, await live.trellis.watermarkToken(), {
      timeoutMs: 20_000,
    });
    const paused = await checked(live.trellis, d.target);
    expect(paused.report).toMatchObject({ outcome: 'consistent', skippedColumns: ['c'] });
  });

  it('a sample across the key space finds what differs among the keys it draws', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE ff_orders (id int PRIMARY KEY, customer int NOT NULL, amount numeric NOT NULL);
      CREATE INDEX ON ff_orders (customer);
      INSERT INTO ff_orders SELECT i, i % 40, i FROM generate_series(1, 2000) i;`);
    const d: Definition = {
      target: 'ff_totals',
      from: 'ff_orders',
      select: 'customer, sum(amount) AS total',
      groupBy: 'customer',
    };
    await live.define(d);
    const consistent = await checked(live.trellis, d.target, { mode: 'sample', sample: 20 });
    expect(consistent).toMatchObject({ state: 'done', mode: 'sample' });
    expect(consistent.report?.outcome).toBe('consistent');
    expect(consistent.report?.rowsCompared).toBeGreaterThan(0);
    expect(consistent.report?.rowsCompared).toBeLessThanOrEqual(20);
    await corrupt(
      live.db,
      d.target,
      `DELETE FROM ff_totals WHERE customer = 3;
       UPDATE ff_totals SET total = 0 WHERE customer = 4;
       INSERT INTO ff_totals (customer, total) VALUES (999, 1);`,
    );
    // Half the sample from the target (40 groups: all drawn), half from source rows (one
    // in four drawn: customer 3's 50 rows cannot all be missed but by a freak).
    const found = await checked(live.trellis, d.target, { mode: 'sample', sample: 1000 });
    expect(found.report?.counts).toEqual({ missing: 1, extra: 1, differs: 1 });
  });
});
