import { loadavg } from 'node:os';
import { type Figure, figure, type Scenario } from './scenario.js';
import { checkpoint, converge, median, percentile, timed, trellisOn } from './support.js';

/**
 * `q11` (issue #22 item 4, ADR 0051, ADR 0061): TPC-H Q11's shape, a GROUP BY over a
 * six-way self-join (`partsupp`–`supplier`–`nation` twice, joined on the nation's name,
 * WHERE on one nation): every group depends on every `partsupp` row of the nation, and its
 * key map is a shadow of the sources. Measured: one `partsupp` row of the nation updated,
 * commit → converged (p50/p99 over BENCH_Q11_WRITES writes); a supplier moved into the
 * nation and back (each of its `partsupp` rows joins every row of the nation), commit →
 * converged; each against the query recomputed whole (its SELECT, run in the same run).
 * BENCH_Q11_PARTSUPP (default 4000 rows: 100 suppliers of 40 rows, 25 nations; 160 rows in
 * the nation), BENCH_Q11_WRITES (default 30).
 */
export const q11: Scenario = {
  name: 'q11',
  title: 'TPC-H Q11 as a GROUP BY over a six-way self-join: one row and one supplier changed',
  async run({ db, log }) {
    const partsupp = Number(process.env.BENCH_Q11_PARTSUPP ?? 4_000);
    const writes = Number(process.env.BENCH_Q11_WRITES ?? 30);
    const perSupplier = 40;
    const suppliers = Math.max(25, Math.ceil(partsupp / perSupplier));
    await db.sql.unsafe(`
      CREATE TABLE q11_nation (n_nationkey int PRIMARY KEY, n_name text NOT NULL);
      CREATE TABLE q11_supplier (s_suppkey int PRIMARY KEY, s_nationkey int NOT NULL);
      CREATE TABLE q11_partsupp (ps_partkey int, ps_suppkey int, ps_availqty int NOT NULL,
                                 ps_supplycost numeric(15,2) NOT NULL,
                                 PRIMARY KEY (ps_partkey, ps_suppkey));
      CREATE INDEX ON q11_nation (n_name);
      CREATE INDEX ON q11_supplier (s_nationkey);
      CREATE INDEX ON q11_partsupp (ps_suppkey);
      INSERT INTO q11_nation SELECT i, CASE WHEN i = 7 THEN 'GERMANY' ELSE 'N' || i END
        FROM generate_series(0, 24) i;
      INSERT INTO q11_supplier SELECT i, i % 25 FROM generate_series(1, ${suppliers}) i;
      INSERT INTO q11_partsupp
        SELECT (s * 7 + j * 13) % ${Math.max(perSupplier * 4, Math.ceil(partsupp / 4))}, s,
               1 + (s * j) % 9999, (1 + (s + j) % 1000) / 10.0
          FROM generate_series(1, ${suppliers}) s, generate_series(1, ${perSupplier}) j
        ON CONFLICT DO NOTHING;
      ANALYZE q11_nation, q11_supplier, q11_partsupp;`);
    const from = `q11_partsupp ps JOIN q11_supplier s ON s.s_suppkey = ps.ps_suppkey
         JOIN q11_nation n ON n.n_nationkey = s.s_nationkey
         JOIN q11_nation n2 ON n2.n_name = n.n_name
         JOIN q11_supplier s2 ON s2.s_nationkey = n2.n_nationkey
         JOIN q11_partsupp ps2 ON ps2.ps_suppkey = s2.s_suppkey`;
    const select = `ps.ps_partkey AS ps_partkey, sum(ps.ps_supplycost * ps.ps_availqty) AS value,
           sum(ps2.ps_supplycost * ps2.ps_availqty) AS nation_value, count(*) AS combinations`;
    const rest = `WHERE n.n_name = 'GERMANY' GROUP BY ps.ps_partkey
       HAVING sum(ps.ps_supplycost * ps.ps_availqty) * count(DISTINCT ps2.ps_partkey)
            > 0.01 * sum(ps2.ps_supplycost * ps2.ps_availqty) * count(DISTINCT ps.ps_suppkey)`;
    const query = `SELECT ${select} FROM ${from} ${rest}`;
    const nationRows = await db.sql<{ ps_partkey: number; ps_suppkey: number }[]>`
      SELECT ps_partkey, ps_suppkey FROM q11_partsupp
       WHERE ps_suppkey IN (SELECT s_suppkey FROM q11_supplier WHERE s_nationkey = 7)
       ORDER BY 1, 2`;
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    const figures: Figure[] = [];
    try {
      const buildMs = await timed(async () => {
        await trellis.apply(`TRANSFORM q11_value FROM ${from} SELECT ${select} ${rest}`);
        await converge(trellis, 'q11_value');
      });
      // The query recomputed whole, as a user would otherwise run it (median of 5).
      const recomputes: number[] = [];
      for (let i = 0; i < 5; i++) {
        recomputes.push(await timed(() => db.sql.unsafe(`SELECT count(*) FROM (${query}) q`)));
      }
      const recomputeMs = median(recomputes);
      log(
        `${partsupp.toLocaleString('en-US')} partsupp rows (${nationRows.length} in the nation): build ${buildMs.toFixed(0)} ms, the query recomputed ${recomputeMs.toFixed(1)} ms`,
      );
      await checkpoint(db);
      const latencies: number[] = [];
      for (let i = 0; i < writes; i++) {
        const row = nationRows[(i * 37) % nationRows.length]!;
        latencies.push(
          await timed(async () => {
            await db.sql`UPDATE q11_partsupp SET ps_availqty = ps_availqty + 1
                          WHERE ps_partkey = ${row.ps_partkey} AND ps_suppkey = ${row.ps_suppkey}`;
            await converge(trellis, 'q11_value');
          }),
        );
      }
      const sorted = [...latencies].sort((a, b) => a - b);
      const p50 = percentile(sorted, 50);
      const p99 = percentile(sorted, 99);
      const load = loadavg()[0]!;
      log(
        `one partsupp row updated → converged: p50 ${p50.toFixed(0)} ms, p99 ${p99.toFixed(0)} ms (${(p50 / recomputeMs).toFixed(2)}× and ${(p99 / recomputeMs).toFixed(2)}× the recompute; load ${load.toFixed(1)})`,
      );
      const baseline = { label: 'the query recomputed (one SELECT)', value: recomputeMs };
      figures.push(
        figure({
          scenario: 'q11',
          figure: 'one partsupp row of the nation updated → converged, p50',
          value: p50,
          unit: 'ms',
          baseline,
          detail: { samples: latencies, load, mode: (await trellis.status('q11_value')).lastApply },
        }),
        figure({
          scenario: 'q11',
          figure: 'one partsupp row of the nation updated → converged, p99',
          value: p99,
          unit: 'ms',
          baseline,
          detail: { load },
        }),
      );
      // A supplier outside the nation moved into it and back: each of its partsupp rows
      // joins every row of the nation.
      const [outside] = await db.sql<{ s_suppkey: number; rows: number }[]>`
        SELECT s.s_suppkey, count(*)::int AS rows FROM q11_supplier s
          JOIN q11_partsupp ps ON ps.ps_suppkey = s.s_suppkey
         WHERE s.s_nationkey = 3 GROUP BY 1 ORDER BY 1 LIMIT 1`;
      for (const [label, nation] of [
        ['into', 7],
        ['out of', 3],
      ] as const) {
        await checkpoint(db);
        const ms = await timed(async () => {
          await db.sql`UPDATE q11_supplier SET s_nationkey = ${nation} WHERE s_suppkey = ${outside!.s_suppkey}`;
          await converge(trellis, 'q11_value');
        });
        log(
          `a supplier (${outside!.rows} partsupp rows) moved ${label} the nation → converged: ${ms.toFixed(0)} ms (${(ms / recomputeMs).toFixed(2)}× the recompute; load ${loadavg()[0]!.toFixed(1)})`,
        );
        figures.push(
          figure({
            scenario: 'q11',
            figure: `a supplier moved ${label} the nation → converged`,
            value: ms,
            unit: 'ms',
            baseline,
            detail: { rows: outside!.rows, load: loadavg()[0] },
          }),
        );
      }
    } finally {
      await trellis.shutdown();
    }
    return figures;
  },
};
