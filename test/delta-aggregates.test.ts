import { describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { installSql } from '../src/engine/schema/install-sql.js';
import { migrations } from '../src/engine/schema/migrations.generated.js';
import { freshDatabase } from './support/database.js';
import { livePipeline } from './support/live.js';
import { type LoggedLine, recordingLogger } from './support/logging.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { quietLogger, waitForStatus } from './support/trellis.js';

/**
 * Aggregates kept by delta (issue #22, ADR 0044): each changed row's contribution applied
 * to its groups' states, exact for every case a recompute tells apart (numeric scales,
 * NaN and infinities, NULL inputs, groups emptied and refilled, HAVING crossing both
 * ways, extremes removed); and the group recompute wherever no exact delta exists.
 * Every target is compared with its definition run by Postgres after each step.
 */
const logged: LoggedLine[] = [];
const live = livePipeline({ logger: recordingLogger(logged) });

/** Runs each write, then checks every target against its definition. */
describe('aggregates kept by delta', () => {
  it('says how each aggregate is kept, and why', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE m_items (id int PRIMARY KEY, g text, v numeric, p numeric(12,2), f float8,
                            n int, ok boolean);
      CREATE FUNCTION m_prod_step(numeric, numeric) RETURNS numeric
        LANGUAGE sql IMMUTABLE AS 'SELECT $1 * $2';
      CREATE AGGREGATE m_product(numeric) (sfunc = m_prod_step, stype = numeric, initcond = '1');`);
    await live.trellis.apply(
      `TRANSFORM m_delta FROM m_items SELECT g, count(*) AS n, sum(p) FILTER (WHERE ok) AS paid,
         coalesce(avg(v), 0) AS mean, min(n) AS low, bool_or(ok) AS any_ok GROUP BY g`,
    );
    await live.trellis.apply(
      'TRANSFORM m_floats FROM m_items SELECT g, sum(f) AS total, count(*) AS n GROUP BY g',
    );
    await live.trellis.apply(
      'TRANSFORM m_distinct FROM m_items SELECT g, count(DISTINCT n) AS kinds GROUP BY g',
    );
    await live.trellis.apply(
      'TRANSFORM m_custom FROM m_items SELECT g, m_product(v) AS growth GROUP BY g',
    );
    await live.trellis.apply(
      "TRANSFORM m_outside FROM m_items SELECT g, g || ':' || count(*) AS label GROUP BY g",
    );
    // 1.0 = 1.00: a group shows how its rows write its key, which only its rows can say.
    await live.trellis.apply(
      'TRANSFORM m_by_amount FROM m_items SELECT v, count(*) AS n GROUP BY v',
    );
    const byTarget = Object.fromEntries(
      (await live.trellis.definitions()).map((d) => [d.target, d.maintenance]),
    );
    expect(byTarget.m_by_amount?.mode).toBe('group');
    expect(byTarget.m_by_amount?.reason).toBe(
      'GROUP BY v (numeric): equal values of it can be written differently, and a group shows how its rows write it',
    );
    expect(byTarget.m_delta).toEqual({
      mode: 'delta',
      reason: 'every aggregate has an exact delta',
      aggregates: [
        { call: 'count(*)', how: 'delta', why: null },
        { call: 'sum(p) FILTER (WHERE ok)', how: 'delta', why: null },
        { call: 'avg(v)', how: 'delta+rescan', why: null },
        { call: 'min(n)', how: 'delta+rescan', why: null },
        { call: 'bool_or(ok)', how: 'delta', why: null },
      ],
    });
    expect(byTarget.m_floats?.mode).toBe('group');
    expect(byTarget.m_floats?.reason).toBe(
      'sum(f): sum of double precision: a delta is not exact for this type (floating-point sums depend on the order rows are added in)',
    );
    expect(byTarget.m_floats?.aggregates.map((a) => a.how)).toEqual(['recompute', 'recompute']);
    expect(byTarget.m_distinct?.reason).toBe(
      'count(DISTINCT n): DISTINCT needs every row of the group',
    );
    expect(byTarget.m_custom?.reason).toBe(
      'm_product(v): a user-defined aggregate has no known inverse',
    );
    expect(byTarget.m_outside?.reason).toBe('column label reads columns outside its aggregates');
    const projection = await live.trellis.apply('TRANSFORM m_rows FROM m_items SELECT g, v');
    expect(projection.kind).toBe('transform_defined');
    const rows = (await live.trellis.definitions()).find((d) => d.target === 'm_rows');
    expect(rows?.maintenance.mode).toBe('rows');
  });

  it('stays exact through numeric scales, NaN and infinities, NULLs, emptied groups, HAVING and removed extremes', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE d_items (id int PRIMARY KEY, g text, v numeric, p numeric(12,2), n int,
                            big bigint, ok boolean, label text);
      CREATE INDEX ON d_items (g);
      INSERT INTO d_items
        SELECT i, 'g' || (i % 4), i * 1.5, i, i % 7, i * 1000000000000, i % 3 = 0, 'l' || (i % 5)
          FROM generate_series(1, 200) i;`);
    const groups: Definition = {
      target: 'd_groups',
      from: 'd_items',
      select: `g, count(*) AS n, count(v) AS nv, sum(v) AS total, avg(v) AS mean,
               sum(p) FILTER (WHERE ok) AS paid, avg(n) AS mean_n, sum(n) AS sum_n,
               sum(big) AS sum_big, min(n) AS low, max(label) AS high, bool_and(ok) AS all_ok,
               bool_or(ok) AS any_ok, coalesce(sum(p), 0) - count(*) AS net`,
      groupBy: 'g',
      having: 'sum(n) > 20',
    };
    const total: Definition = {
      target: 'd_total',
      from: 'd_items',
      select: 'count(*) AS n, sum(v) AS total, min(n) AS low, max(n) IS NULL AS none',
    };
    const filtered: Definition = {
      target: 'd_filtered',
      from: 'd_items',
      select: 'g, count(*) AS n, max(n) AS high',
      where: 'n IS NOT NULL AND n > 1',
      groupBy: 'g',
    };
    await live.define(groups, total, filtered);
    await live.converged([groups, total, filtered]);
    const defs = [groups, total, filtered];
    await live.steps(defs, [
      // Mixed scales: the sum's scale is its inputs' largest, and falls back when it goes.
      'UPDATE d_items SET v = 1.00 WHERE id = 4; UPDATE d_items SET v = 2.5000 WHERE id = 8',
      'DELETE FROM d_items WHERE id = 8',
      "UPDATE d_items SET v = v * 1.000 WHERE g = 'g1'",
      "UPDATE d_items SET v = round(v, 1) WHERE g = 'g1'",
      // NaN and infinities, then back.
      "UPDATE d_items SET v = 'NaN' WHERE id = 12",
      "UPDATE d_items SET v = 'Infinity' WHERE id = 16; UPDATE d_items SET v = '-Infinity' WHERE id = 20",
      'UPDATE d_items SET v = 3 WHERE id IN (12, 20)',
      'UPDATE d_items SET v = 4 WHERE id = 16',
      // NULL inputs and a NULL group.
      'UPDATE d_items SET v = NULL, n = NULL, ok = NULL WHERE id % 10 = 3',
      'UPDATE d_items SET g = NULL WHERE id IN (1, 5, 9)',
      // Extremes removed: the group's min and max are read again.
      "DELETE FROM d_items WHERE n = 0 AND g = 'g2'",
      "UPDATE d_items SET label = 'a' WHERE label = 'l4'",
      // Rows move between groups; a group emptied, then filled again.
      "UPDATE d_items SET g = 'g0' WHERE g = 'g3' AND id < 100",
      "DELETE FROM d_items WHERE g = 'g3'",
      "INSERT INTO d_items VALUES (1000, 'g3', 1.0, 1, 1, 1, true, 'z')",
      // HAVING: out (sum(n) <= 20), then in again.
      "INSERT INTO d_items VALUES (1001, 'h', 1, 1, 15, 1, true, 'x'), (1002, 'h', 1, 1, 3, 1, false, 'y')",
      'UPDATE d_items SET n = 9 WHERE id = 1002',
      'UPDATE d_items SET n = 1 WHERE id = 1002',
      // Everything gone: a grand total stays, counting nothing; then back.
      'DELETE FROM d_items',
      "INSERT INTO d_items VALUES (1, 'g1', 1.10, 2.5, 4, 7, true, 'q'), (2, 'g1', 1.1, 2, 5, 8, false, 'r')",
    ]);
    for (const d of defs) {
      expect((await live.trellis.status(d.target)).lastApply?.mode).toBe('delta');
    }
  });

  it('follows a join: rows moving between groups through the joined table', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE j_customers (id int PRIMARY KEY, tier text);
      CREATE TABLE j_orders (id int PRIMARY KEY, customer_id int, amount numeric(10,2), qty int);
      CREATE INDEX ON j_orders (customer_id);
      INSERT INTO j_customers SELECT i, 't' || (i % 3) FROM generate_series(1, 30) i;
      INSERT INTO j_orders SELECT i, i % 31, i, i % 4 FROM generate_series(1, 300) i;`);
    const inner: Definition = {
      target: 'j_tiers',
      from: 'j_orders o JOIN j_customers c ON c.id = o.customer_id',
      select: 'c.tier, count(*) AS n, sum(o.amount) AS total, max(o.qty) AS most',
      where: 'o.qty > 0',
      groupBy: 'c.tier',
    };
    const left: Definition = {
      target: 'j_left',
      from: 'j_customers c LEFT JOIN j_orders o ON o.customer_id = c.id',
      select: 'c.tier, count(o.id) AS orders, sum(o.amount) AS total',
      where: "c.tier <> 't9'",
      groupBy: 'c.tier',
    };
    await live.define(inner, left);
    await live.converged([inner, left]);
    await live.steps(
      [inner, left],
      [
        "UPDATE j_customers SET tier = 't0' WHERE id = 4",
        'UPDATE j_orders SET customer_id = 5 WHERE customer_id = 7',
        'DELETE FROM j_customers WHERE id = 10',
        "UPDATE j_customers SET tier = 't9' WHERE id = 11",
        "INSERT INTO j_customers VALUES (10, 't1'), (31, 't5')",
        'UPDATE j_orders SET qty = 0 WHERE id % 3 = 0',
        'UPDATE j_orders SET qty = 3 WHERE qty = 0 AND id % 2 = 0',
        'DELETE FROM j_orders WHERE customer_id IN (1, 2, 3)',
      ],
    );
    expect((await live.trellis.status('j_tiers')).lastApply?.mode).toBe('delta');
  });

  it('recomputes every group for a burst over most rows, when cheaper, and deltas go on exact after', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE b_items (id int PRIMARY KEY, g int, v numeric, n int);
      CREATE INDEX ON b_items (g);
      INSERT INTO b_items SELECT i, i % 2000, i * 0.5, i % 11 FROM generate_series(1, 20000) i;
      ANALYZE b_items;`);
    const d: Definition = {
      target: 'b_totals',
      from: 'b_items',
      select: 'g, count(*) AS n, sum(v) AS total, max(n) AS high',
      groupBy: 'g',
    };
    await live.define(d);
    await live.trellis.apply(`PAUSE TRANSFORM ${d.target}`);
    // What each way has cost it before, as if measured (the build's own measurements vary
    // with the server and the capture): a delta dear per row, a recompute cheap.
    await live.db
      .sql`UPDATE trellis.pipeline p SET apply_costs = '{"delta": 0.5, "recompute": 0.001}'
                        FROM trellis.transforms t WHERE t.id = p.transform_id AND t.target_name = 'b_totals'`;
    await live.db.sql.unsafe(`
      UPDATE b_items SET v = v + 1, g = g + 1 WHERE id % 5 <> 0;
      DELETE FROM b_items WHERE id % 7 = 0;
      INSERT INTO b_items SELECT i, i % 2500, i, i % 3 FROM generate_series(30000, 31000) i;`);
    // Under WAL capture the decoder writes the burst in batches, which may stage as more
    // than one range; the burst's bulk is the range with the most keys, whichever applied
    // last. Each applied range is logged with its mode and keys.
    const resumedAt = Date.now();
    await live.trellis.apply(`RESUME TRANSFORM ${d.target}`);
    await live.converged(d);
    const applied = logged.filter(
      (l) => l.at >= resumedAt && l.obj.target === d.target && typeof l.obj.keys === 'number',
    );
    const bulk = applied.reduce<LoggedLine | undefined>(
      (most, l) => (most && Number(most.obj.keys) >= Number(l.obj.keys) ? most : l),
      undefined,
    );
    expect(bulk?.obj.mode).toBe('recompute');
    expect(bulk?.msg).toMatch(/: recompute estimated at [\d,]+ ms, delta at [\d,]+ ms/);
    // The key map and the group states were made again with the target: deltas after it
    // start from them.
    await live.steps(
      [d],
      [
        'UPDATE b_items SET g = 1 WHERE id BETWEEN 100 AND 120',
        'DELETE FROM b_items WHERE g = 2',
        'UPDATE b_items SET n = 50 WHERE id = 3',
      ],
    );
    expect((await live.trellis.status(d.target)).lastApply?.mode).toBe('delta');
    // What it cost is measured, for the next choices.
    const [row] = await live.db.sql<{ costs: Record<string, number> | null }[]>`
      SELECT p.apply_costs AS costs FROM trellis.pipeline p
        JOIN trellis.transforms t ON t.id = p.transform_id WHERE t.target_name = ${d.target}`;
    expect(row?.costs?.recompute).toBeGreaterThan(0);
  });

  it('recomputes the changed groups where no exact delta exists, and stays right', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE r_items (id int PRIMARY KEY, g int, v numeric, f float8, n int);
      CREATE INDEX ON r_items (g);
      INSERT INTO r_items SELECT i, i % 5, i * 1.25, i * 0.5, i % 9 FROM generate_series(1, 100) i;`);
    const fallbacks: Definition[] = [
      {
        target: 'r_floats',
        from: 'r_items',
        select: 'g, sum(f) AS total, avg(f) AS mean',
        groupBy: 'g',
      },
      {
        target: 'r_distinct',
        from: 'r_items',
        select: 'g, count(DISTINCT n) AS kinds, count(*) AS n',
        groupBy: 'g',
      },
      {
        target: 'r_ordered',
        from: 'r_items',
        select: `g, string_agg(id::text, ',' ORDER BY id) AS ids,
                 percentile_disc(0.5) WITHIN GROUP (ORDER BY n) AS median`,
        groupBy: 'g',
      },
      {
        target: 'r_outside',
        from: 'r_items',
        select: 'g, g * 10 + count(*) AS mixed',
        groupBy: 'g',
      },
      {
        target: 'r_having',
        from: 'r_items',
        select: 'g, sum(v) AS total',
        groupBy: 'g',
        having: 'count(DISTINCT n) > 3',
      },
      {
        target: 'r_by_value',
        from: 'r_items',
        select: 'v, count(*) AS n, sum(g) AS groups',
        groupBy: 'v',
      },
      {
        target: 'r_minmax',
        from: 'r_items',
        select: 'g, min(v) AS low, max(f) AS high',
        groupBy: 'g',
      },
    ];
    await live.define(...fallbacks);
    for (const d of fallbacks) {
      const def = (await live.trellis.definitions()).find((x) => x.target === d.target);
      expect(def?.maintenance.mode, d.target).toBe('group');
    }
    await live.steps(fallbacks, [
      'UPDATE r_items SET g = 0 WHERE id % 7 = 0',
      'DELETE FROM r_items WHERE n = 3',
      'UPDATE r_items SET v = v * 1.00, f = -f WHERE g = 2',
      'INSERT INTO r_items SELECT i, i % 3, i, i, i % 4 FROM generate_series(500, 520) i',
      'DELETE FROM r_items WHERE g = 4',
    ]);
    for (const d of fallbacks) {
      // Re-derived group by group, or every group recomputed for a burst: never by delta.
      expect((await live.trellis.status(d.target)).lastApply?.mode, d.target).not.toBe('delta');
    }
  });
});

describe('a GROUP BY defined before delta maintenance', () => {
  it('is classified by the upgrade, and kept by delta from its next build', async () => {
    const db = await freshDatabase();
    // Installed, and the transform defined, by the release before (schema 23).
    const before = migrations.filter((m) => m.version <= 23);
    await db.sql.unsafe(
      installSql({ schema: 'trellis', targetSchema: 'public', migrations: before }),
    );
    await db.sql.unsafe(`
      CREATE TABLE u_items (id int PRIMARY KEY, g int, v numeric);
      INSERT INTO u_items SELECT i, i % 4, i FROM generate_series(1, 100) i;`);
    const d: Definition = {
      target: 'u_totals',
      from: 'u_items',
      select: 'g, count(*) AS n, sum(v) AS total',
      groupBy: 'g',
    };
    await db.sql.unsafe(`SELECT trellis.apply($1)`, [transformStatement(d)]);
    {
      await using migrator = await Trellis.connect({ url: db.url, logger: quietLogger });
      await migrator.migrate();
      const [def] = await migrator.definitions();
      expect(def?.maintenance.mode).toBe('group');
      expect(def?.maintenance.reason).toBe(
        'every aggregate has an exact delta: kept by delta from its next build (defined before trellis-pg kept aggregates by delta; requestBackfill() rebuilds it)',
      );
    }
    await using trellis = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 1,
      logger: quietLogger,
    });
    await waitForStatus(trellis, d.target, 'live');
    expect((await trellis.definitions())[0]?.maintenance.mode).toBe('delta');
    await db.sql`DELETE FROM u_items WHERE id % 3 = 0`;
    await db.sql`UPDATE u_items SET g = 1 WHERE id < 10`;
    await trellis.awaitConverged(d.target, await trellis.watermarkToken());
    await expectMatchesDefinition(db.sql, d);
    expect((await trellis.status(d.target)).lastApply?.mode).toBe('delta');
  });
});
