import { describe, expect, it } from 'vitest';
import { formatExplanation } from '../src/engine/catalog/explain.js';
import { trellisInProcess } from './support/cli.js';
import { livePipeline } from './support/live.js';
import { waitForStatus } from './support/trellis.js';

// EXPLAIN TRANSFORM <statement> (issue #26, item 2; ADR 0069): the plan a statement would
// get, before anything is defined — from SQL (explain(), apply('EXPLAIN …')), the handle
// and the CLI — the same as explain(target) says once it is defined, and nothing left
// behind; a refused statement gives the reason defining it would.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE ex_orders (id int PRIMARY KEY, customer_id int NOT NULL, amount numeric NOT NULL, status text);
      CREATE TABLE ex_items (order_id int NOT NULL, line int NOT NULL, qty int, PRIMARY KEY (order_id, line));
      INSERT INTO ex_orders SELECT i, i % 7, i * 1.5, CASE WHEN i % 3 = 0 THEN 'open' END FROM generate_series(1, 50) i;
      INSERT INTO ex_items SELECT i % 50 + 1, i, i % 4 FROM generate_series(1, 120) i;`);
  },
});

/** What the catalog holds of transforms and tables: explaining must leave both as they were. */
async function footprint(): Promise<{ transforms: number; tables: number }> {
  const [row] = await live.db.sql<{ transforms: number; tables: number }[]>`
    SELECT (SELECT count(*) FROM trellis.transforms)::int AS transforms,
           (SELECT count(*) FROM pg_class WHERE relkind = 'r')::int AS tables`;
  return row!;
}

describe('EXPLAIN TRANSFORM', () => {
  it('explains a statement as its definition would be explained, and defines nothing', async () => {
    const statement = `TRANSFORM ex_totals AS
      SELECT o.customer_id, count(*) AS n, sum(o.amount) AS total, max(i.qty) AS most
        FROM ex_orders o JOIN ex_items i ON i.order_id = o.id
       WHERE o.status IS NULL
       GROUP BY o.customer_id`;
    const before = await footprint();
    const e = await live.trellis.explain(statement);
    expect(await footprint()).toEqual(before);
    expect(e.defined).toBe(false);
    expect(e.refused).toBeNull();
    expect(e.target).toBe('ex_totals');
    expect(e.chain).toEqual(['ex_totals']);
    const [self] = e.parts;
    // Each order's items join it on its key: no join row is counted twice, so the
    // aggregates are kept by delta, max's with a rescan when its extreme goes.
    expect(self?.mode).toBe('delta');
    expect(self?.aggregates.map((a) => [a.call, a.how])).toEqual([
      ['count(*)', 'delta'],
      ['sum(o.amount)', 'delta+rescan'],
      ['max(i.qty)', 'delta+rescan'],
    ]);
    expect(self?.key).toEqual(['customer_id']);
    expect(self?.state).toMatchObject({ keyMap: 'groups', groupStates: true });
    // The GROUP BY column has no index, which reading a group again needs.
    expect(self?.needs.map((n) => n.fix).join('\n')).toMatch(
      /CREATE INDEX .*ex_orders.*customer_id/,
    );
    expect(self?.drainSql).toBeNull();

    // Defined, explain(target) says the same of it (but for the drain's SQL).
    await live.trellis.apply(statement);
    await waitForStatus(live.trellis, 'ex_totals', 'live');
    const defined = await live.trellis.explain('ex_totals');
    expect(defined.defined).toBe(true);
    const strip = (x: typeof e) => ({
      target: x.target,
      statement: x.statement,
      chain: x.chain,
      parts: x.parts.map(({ drainSql: _, ...p }) => p),
    });
    expect(strip(e)).toEqual(strip(defined));
    expect(defined.parts[0]?.drainSql).toMatch(/^WITH changed AS MATERIALIZED/);

    // Orders joined to the orders of the same customer: a join that multiplies rows keeps
    // a shadow of its sources (ADR 0051), and its counts are kept by delta, signed from
    // the shadow (ADR 0067), beside group states.
    const pairs = await live.trellis.explain(`TRANSFORM ex_pairs AS
      SELECT o.customer_id, count(*) AS n FROM ex_orders o
        JOIN ex_orders p ON p.customer_id = o.customer_id GROUP BY o.customer_id`);
    expect(pairs.parts[0]).toMatchObject({
      mode: 'delta',
      state: { keyMap: 'shadow', groupStates: true },
    });
    expect(pairs.parts[0]?.state.description).toMatch(
      /^a shadow of each joined table .*; group states/,
    );
    // A LEFT JOIN that multiplies rows is kept by delta too (ADR 0067, addendum), and a
    // float sum over it keeps it a group recompute.
    const left = await live.trellis.explain(`TRANSFORM ex_left_pairs AS
      SELECT o.customer_id, count(p.id) AS n FROM ex_orders o
        LEFT JOIN ex_orders p ON p.customer_id = o.customer_id GROUP BY o.customer_id`);
    expect(left.parts[0]).toMatchObject({
      mode: 'delta',
      state: { keyMap: 'shadow', groupStates: true },
    });
    expect(left.parts[0]?.aggregates.map((a) => a.how)).toEqual(['delta']);
    const leftFloat = await live.trellis.explain(`TRANSFORM ex_left_floats AS
      SELECT o.customer_id, sum(p.amount::float8) AS f FROM ex_orders o
        LEFT JOIN ex_orders p ON p.customer_id = o.customer_id GROUP BY o.customer_id`);
    expect(leftFloat.parts[0]).toMatchObject({
      mode: 'group recompute',
      state: { keyMap: 'shadow', groupStates: false },
    });
    expect(leftFloat.parts[0]?.aggregates.map((a) => a.how)).toEqual(['recompute']);
  });

  it('explains parts and the state kept by delta, from SQL and through apply()', async () => {
    const statement = `EXPLAIN TRANSFORM ex_big AS
      WITH per AS (SELECT customer_id, sum(amount) AS total FROM ex_orders GROUP BY customer_id)
      SELECT count(*) AS customers, sum(total) AS total FROM per WHERE total > 10`;
    const before = await footprint();
    const [viaExplain] = await live.db.sql<{ e: Record<string, unknown> }[]>`
      SELECT trellis.explain(${statement}) AS e`;
    const [viaApply] = await live.db.sql<{ e: Record<string, unknown> }[]>`
      SELECT trellis.apply(${statement}) AS e`;
    expect(await footprint()).toEqual(before);
    expect(viaApply?.e).toEqual(viaExplain?.e);
    const e = await live.trellis.explain(statement);
    expect(e.chain).toEqual(['trellis#ex_big#per', 'ex_big']);
    expect(e.parts.map((p) => [p.name, p.mode])).toEqual([
      ['per', 'delta'],
      [null, 'delta'],
    ]);
    expect(e.parts[0]?.state).toMatchObject({ keyMap: 'groups', groupStates: true });
    expect(e.parts[0]?.state.description).toMatch(
      /one row per source row .*group states: one row per group/,
    );
    expect(e.parts[1]?.reads[0]?.writtenBy).toEqual(['trellis#ex_big#per']);
    const text = formatExplanation(e);
    expect(text).toContain('part per (trellis#ex_big#per):');
    expect(text).toContain('  state: a key map: one row per source row');
    expect(text).toContain('drain SQL: once defined');
  });

  it('gives what defining would refuse, and why; the CLI exits as defining would', async () => {
    const refused = await live.trellis.explain(
      'TRANSFORM ex_bad AS SELECT customer_id, random() AS r FROM ex_orders',
    );
    expect(refused.refused).toMatchObject({ code: 'validation' });
    expect(refused.refused?.message).toMatch(/random/);
    expect(refused.parts).toEqual([]);
    const parse = await live.trellis.explain('TRANSFORM ex_bad AS SELEC x FROM ex_orders');
    expect(parse.refused?.code).toBe('parse');
    // A name already taken is refused as defining would refuse it.
    await live.trellis.apply('TRANSFORM ex_rows AS SELECT id, amount FROM ex_orders');
    const taken = await live.trellis.explain('TRANSFORM ex_rows AS SELECT id FROM ex_orders');
    expect(taken.refused?.code).toBe('conflict');

    const ok = await trellisInProcess(
      [
        'explain',
        'TRANSFORM ex_cli AS SELECT status, count(*) AS n FROM ex_orders GROUP BY status',
      ],
      { DATABASE_URL: live.db.url },
    );
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain('ex_cli (the transform):');
    expect(ok.stdout).toMatch(/maintenance: delta: /);
    expect(ok.stdout).toContain('state: a key map');
    const bad = await trellisInProcess(
      ['explain', 'TRANSFORM ex_cli AS SELECT customer_id, random() AS r FROM ex_orders'],
      { DATABASE_URL: live.db.url },
    );
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/random/);
    const json = await trellisInProcess(['explain', 'TRANSFORM ex_cli AS SELEC', '--json'], {
      DATABASE_URL: live.db.url,
    });
    expect(json.code).toBe(2);
    expect(JSON.parse(json.stdout)).toMatchObject({ refused: { code: 'parse' }, parts: [] });
    expect((await live.trellis.definitions()).map((d) => d.target).sort()).toEqual([
      'ex_rows',
      'ex_totals',
    ]);
  });
});
