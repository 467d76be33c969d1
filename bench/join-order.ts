import { loadavg } from 'node:os';
import { type Figure, figure, type Scenario } from './scenario.js';
import { checkpoint, converge, median, timed, trellisOn } from './support.js';

/**
 * `join-order` (issue #22, ADR 0074): TPC-H Q5's shape, a GROUP BY over a six-way join
 * (customer, orders, lineitem, supplier, nation, region; its key map a shadow of the
 * sources), kept by delta and (with a `count(DISTINCT …)`) by group recompute, after a
 * refresh round (hundreds of keys of four tables in one transaction) or one row of
 * lineitem, orders or customer changed, commit → converged, against the query recomputed whole (its SELECT) in the same run. Measured twice on
 * the same data: with the planner's own settings for the statements applying changes
 * (`trellis.apply_settings = 'off'`: before ADR 0074) and as the drain plans them now (JIT
 * off, the join order as written, from the changed rows outward). BENCH_JOIN_ORDERS
 * (default 5000 orders, 4 lines each), BENCH_JOIN_WRITES (default 3 per source and pass).
 */
export const joinOrder: Scenario = {
  name: 'join-order',
  title: 'A six-way join (TPC-H Q5) re-derived after one row changed, before and after ADR 0074',
  async run({ db, log }) {
    const orders = Number(process.env.BENCH_JOIN_ORDERS ?? 5_000);
    const writes = Number(process.env.BENCH_JOIN_WRITES ?? 3);
    const customers = Math.max(150, Math.ceil(orders / 10));
    const suppliers = Math.max(30, Math.ceil(orders / 100));
    await db.sql.unsafe(`
      CREATE TABLE jo_region (r_regionkey int PRIMARY KEY, r_name text NOT NULL);
      CREATE TABLE jo_nation (n_nationkey int PRIMARY KEY, n_name text NOT NULL, n_regionkey int NOT NULL);
      CREATE TABLE jo_customer (c_custkey int PRIMARY KEY, c_nationkey int NOT NULL);
      CREATE TABLE jo_supplier (s_suppkey int PRIMARY KEY, s_nationkey int NOT NULL);
      CREATE TABLE jo_orders (o_orderkey int PRIMARY KEY, o_custkey int NOT NULL, o_orderdate date NOT NULL);
      CREATE TABLE jo_lineitem (l_orderkey int, l_linenumber int, l_suppkey int NOT NULL,
                                l_extendedprice numeric(15,2) NOT NULL, l_discount numeric(15,2) NOT NULL,
                                PRIMARY KEY (l_orderkey, l_linenumber));
      CREATE INDEX ON jo_orders (o_custkey);
      CREATE INDEX ON jo_lineitem (l_suppkey);
      INSERT INTO jo_region SELECT i, (ARRAY['AFRICA','AMERICA','ASIA','EUROPE','MIDDLE EAST'])[i + 1]
        FROM generate_series(0, 4) i;
      INSERT INTO jo_nation SELECT i, 'NATION ' || i, i % 5 FROM generate_series(0, 24) i;
      INSERT INTO jo_customer SELECT i, (i * 7) % 25 FROM generate_series(1, ${customers}) i;
      INSERT INTO jo_supplier SELECT i, (i * 11) % 25 FROM generate_series(1, ${suppliers}) i;
      INSERT INTO jo_orders SELECT i, 1 + (i * 13) % ${customers}, date '1992-01-01' + (i * 17) % 2400
        FROM generate_series(1, ${orders}) i;
      INSERT INTO jo_lineitem SELECT o, l, 1 + (o * 3 + l * 5) % ${suppliers}, 100 + (o * l) % 9000, ((o + l) % 10) / 100.0
        FROM generate_series(1, ${orders}) o, generate_series(1, 4) l;
      ANALYZE jo_region, jo_nation, jo_customer, jo_supplier, jo_orders, jo_lineitem;`);
    const from = `
      FROM jo_customer, jo_orders, jo_lineitem, jo_supplier, jo_nation, jo_region
     WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey
       AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey
       AND r_name = 'ASIA' AND o_orderdate >= date '1994-01-01'
       AND o_orderdate < date '1994-01-01' + interval '1' year
     GROUP BY n_name`;
    // Kept by delta (ADR 0067), and by group recompute (count(DISTINCT …): ADR 0051).
    const body = `SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue${from}`;
    const bodyGroups = `SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue,
      count(DISTINCT o_orderkey) AS orders${from}`;
    const targets = [
      ['jo_q5', 'by delta'],
      ['jo_q5_groups', 'by group'],
    ] as const;
    const recomputes: number[] = [];
    for (let i = 0; i < 5; i++) {
      recomputes.push(await timed(() => db.sql.unsafe(`SELECT count(*) FROM (${body}) q`)));
    }
    const recomputeMs = median(recomputes);
    // Rows in the query's year and region (a change there moves a group).
    const [hit] = await db.sql<{ o: number; c: number }[]>`
      SELECT o.o_orderkey AS o, o.o_custkey AS c FROM jo_orders o
        JOIN jo_customer c ON c.c_custkey = o.o_custkey JOIN jo_nation n ON n.n_nationkey = c.c_nationkey
       WHERE n.n_regionkey = 2 AND o.o_orderdate >= date '1994-01-01' AND o.o_orderdate < date '1995-01-01'
       ORDER BY 1 LIMIT 1`;
    const changes: Array<[string, (i: number) => string]> = [
      [
        // As TPC-H's refresh churn leaves a range: hundreds of keys of four tables at once.
        'a refresh round (a line of 1 order in 100, 40 orders, 10 customers, 5 suppliers)',
        (
          i,
        ) => `UPDATE jo_lineitem SET l_discount = ${(i % 10) / 100} WHERE l_orderkey % 100 = ${i} AND l_linenumber = 1;
          UPDATE jo_orders SET o_orderdate = o_orderdate + ${i % 2 ? 3 : -3} WHERE o_orderkey % ${Math.max(1, Math.floor(orders / 40))} = ${i};
          UPDATE jo_customer SET c_nationkey = (c_nationkey + 5) % 25 WHERE c_custkey % ${Math.max(1, Math.floor(customers / 10))} = ${i};
          UPDATE jo_supplier SET s_nationkey = (s_nationkey + 5) % 25 WHERE s_suppkey % ${Math.max(1, Math.floor(suppliers / 5))} = ${i}`,
      ],
      [
        'a lineitem row',
        (i) =>
          `UPDATE jo_lineitem SET l_discount = ${(i % 10) / 100} WHERE l_orderkey = ${hit!.o + i * 3} AND l_linenumber = 1`,
      ],
      [
        'an orders row',
        (i) =>
          `UPDATE jo_orders SET o_orderdate = o_orderdate + ${i % 2 ? 1 : -1} WHERE o_orderkey = ${hit!.o + i * 5}`,
      ],
      [
        'a customer row',
        (i) =>
          `UPDATE jo_customer SET c_nationkey = (c_nationkey + ${i % 2 ? 5 : 20}) % 25 WHERE c_custkey = ${hit!.c}`,
      ],
    ];
    const figures: Figure[] = [];
    const baseline = { label: 'the query recomputed (one SELECT)', value: recomputeMs };
    const results = new Map<string, number>();
    let buildMs = 0;
    for (const pass of ['before', 'after'] as const) {
      // Before: the statements applying changes planned with the planner's own settings.
      await db.sql.unsafe(
        pass === 'before'
          ? `ALTER DATABASE ${db.name} SET trellis.apply_settings = 'off'`
          : `ALTER DATABASE ${db.name} RESET trellis.apply_settings`,
      );
      const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
      try {
        if (pass === 'before') {
          buildMs = await timed(async () => {
            await trellis.apply(`TRANSFORM jo_q5 AS ${body}`);
            await trellis.apply(`TRANSFORM jo_q5_groups AS ${bodyGroups}`);
            await converge(trellis, 'jo_q5');
            await converge(trellis, 'jo_q5_groups');
          });
          log(
            `${orders.toLocaleString('en-US')} orders, ${(orders * 4).toLocaleString('en-US')} lines: build ${buildMs.toFixed(0)} ms, the query recomputed ${recomputeMs.toFixed(1)} ms`,
          );
        }
        for (const [label, statement] of changes) {
          const samples = new Map<string, number[]>(targets.map(([t]) => [t, []]));
          for (let i = 0; i < writes; i++) {
            await checkpoint(db);
            const started = performance.now();
            // One transaction, however many statements.
            const statements = statement(i + (pass === 'after' ? writes : 0)).split(';');
            await db.sql.begin(async (tx) => {
              for (const one of statements) await tx.unsafe(one);
            });
            const token = await trellis.watermarkToken();
            await Promise.all(
              targets.map(async ([t]) => {
                await trellis.awaitConverged(t, token, { timeoutMs: 600_000 });
                samples.get(t)!.push(performance.now() - started);
              }),
            );
          }
          for (const [t, how] of targets) {
            const ms = median(samples.get(t)!);
            results.set(`${pass} ${label} ${how}`, ms);
            const mode = (await trellis.status(t)).lastApply?.mode;
            log(
              `${pass}: ${label} changed → ${how} converged, median ${ms.toFixed(0)} ms (${(ms / recomputeMs).toFixed(2)}× the recompute; ${mode}; load ${loadavg()[0]!.toFixed(1)})`,
            );
            figures.push(
              figure({
                scenario: 'join-order',
                figure: `${label} changed → ${how} converged (${pass === 'before' ? 'planner settings' : 'ADR 0074'}), median`,
                value: ms,
                unit: 'ms',
                baseline,
                detail: { samples: samples.get(t), mode, load: loadavg()[0] },
              }),
            );
          }
        }
      } finally {
        await trellis.shutdown();
      }
    }
    await db.sql.unsafe(`ALTER DATABASE ${db.name} RESET trellis.apply_settings`);
    for (const [label] of changes) {
      for (const [, how] of targets) {
        const before = results.get(`before ${label} ${how}`)!;
        const after = results.get(`after ${label} ${how}`)!;
        log(
          `${label}, ${how}: ${before.toFixed(0)} ms → ${after.toFixed(0)} ms (${(before / after).toFixed(2)}× faster; recompute ${recomputeMs.toFixed(0)} ms)`,
        );
      }
    }
    return figures;
  },
};
