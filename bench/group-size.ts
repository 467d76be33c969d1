import { loadavg } from 'node:os';
import { measureFreshness } from './freshness-measure.js';
import { backendCpu, cpuBetween } from './proc-cpu.js';
import { type Figure, figure, type Scenario } from './scenario.js';
import { type BenchDb, checkpoint, converge, percentile, timed, trellisOn } from './support.js';

/**
 * `group-size` (issue #22): a GROUP BY of `count(*)`, `sum(v)` kept by delta over N rows,
 * in 5 groups and in N/10 groups, under single-row writes at a steady rate (INSERT, an
 * UPDATE moving a row to another group, DELETE, in turn): commit → visible p50/p99, the
 * writes a second achieved, and the drain's CPU per changed row (its backends, from
 * /proc, and this Node process, which also runs the writers). Baseline, measured in the
 * same run: the aggregate recomputed in one SELECT (what a refresh would cost per tick).
 *
 * BENCH_GROUP_SIZE_N: row counts, comma-separated (default 200000; the figures:
 * 1000000,4000000,16000000). BENCH_GROUP_SIZE_RATES: writes a second (default 200; the
 * issue's: 200,1000). BENCH_SECONDS: seconds of writes per measurement.
 */
const APP = 'trellis-bench-group-size';

const list = (name: string, fallback: string): number[] =>
  (process.env[name] ?? fallback)
    .split(',')
    .map((s) => Number(s.trim()))
    .filter((n) => n > 0);

async function oneShape(
  db: BenchDb,
  n: number,
  groups: number,
  rates: number[],
  seconds: number,
  log: (message: string) => void,
): Promise<Figure[]> {
  await db.sql.unsafe(`
    DROP TABLE IF EXISTS gs_src CASCADE;
    CREATE TABLE gs_src (id bigint PRIMARY KEY, grp int NOT NULL, v int NOT NULL, seq int NOT NULL DEFAULT 0);
    INSERT INTO gs_src SELECT g, g % ${groups}, g % 1000, 0 FROM generate_series(1, ${n}) g;
    CREATE INDEX ON gs_src (grp);
    ANALYZE gs_src;`);
  const select =
    'SELECT grp, count(*) AS n, sum(v) AS total, max(seq) AS last_seq FROM gs_src GROUP BY grp';
  await checkpoint(db);
  const recomputeMs = await timed(() => db.sql.unsafe(select));
  const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2, applicationName: APP });
  const figures: Figure[] = [];
  const label = `${n.toLocaleString('en-US')} rows in ${groups.toLocaleString('en-US')} groups`;
  try {
    await trellis.apply(`TRANSFORM gs_agg FROM gs_src ${select.replace(' FROM gs_src', '')}`);
    await converge(trellis, 'gs_agg');
    const mode = (await trellis.definitions()).find((d) => d.target === 'gs_agg')?.maintenance
      ?.mode;
    let nextId = n + 1;
    for (const rate of rates) {
      const before = await backendCpu(db.sql, APP);
      const nodeBefore = process.cpuUsage();
      const started = performance.now();
      // Each write stamps its row with its number (seq), which max(seq) carries to the
      // target: write i is visible once the target's newest stamp is i or later.
      const result = await measureFreshness(
        db.url,
        {
          write: async (sql, i) => {
            const kind = i % 3;
            const id = 1 + Math.floor(Math.random() * n);
            if (kind === 0) {
              return sql`INSERT INTO gs_src (id, grp, v, seq) VALUES (${nextId++}, ${i % groups}, ${i % 1000}, ${i})`;
            }
            if (kind === 1) {
              return sql`UPDATE gs_src SET grp = (grp + 1) % ${groups}, seq = ${i} WHERE id = ${id}`;
            }
            return sql`DELETE FROM gs_src WHERE id = ${id}`;
          },
          poll: async (sql, { lowTarget, lowSource, issued }) => {
            const [row] = await sql<{ t: number | null; s: number | null }[]>`
              SELECT (SELECT max(last_seq) FROM gs_agg) AS t, (SELECT max(seq) FROM gs_src) AS s`;
            const upTo = (low: number, to: number | null) =>
              Array.from(
                { length: Math.max(0, Math.min(issued, to ?? 0) - low + 1) },
                (_, k) => low + k,
              );
            return { target: upTo(lowTarget, row?.t ?? 0), source: upTo(lowSource, row?.s ?? 0) };
          },
        },
        { rate, seconds, writers: 4, pollMs: 5 },
      );
      await converge(trellis, 'gs_agg');
      const elapsed = (performance.now() - started) / 1000;
      const backend = cpuBetween(before, await backendCpu(db.sql, APP));
      const node = process.cpuUsage(nodeBefore);
      const nodeSeconds = (node.user + node.system) / 1e6;
      const changed = result.writes;
      const p50 = percentile(result.target, 50);
      const p99 = percentile(result.target, 99);
      log(
        `${label}, ${rate}/s: p50 ${p50.toFixed(0)} ms, p99 ${p99.toFixed(0)} ms, ${result.writesPerSecond.toFixed(0)} writes/s, drain CPU ${backend === null ? '?' : ((backend * 1000) / changed).toFixed(2)} ms backend + ${((nodeSeconds * 1000) / changed).toFixed(2)} ms node per row (${mode}; recompute ${recomputeMs.toFixed(0)} ms; load ${loadavg()[0]!.toFixed(1)})`,
      );
      const base = { label: 'recompute (one SELECT)', value: recomputeMs };
      const detail = {
        rows: n,
        groups,
        rate,
        mode,
        writes: changed,
        elapsedSeconds: elapsed,
        backendCpuSeconds: backend,
        nodeCpuSeconds: nodeSeconds,
        load: loadavg()[0],
        writesPerSecond: result.writesPerSecond,
        seen: result.target.length,
      };
      figures.push(
        figure({
          scenario: 'group-size',
          figure: `${label}, ${rate} writes/s: commit → visible p50`,
          value: p50,
          unit: 'ms',
          baseline: base,
          detail,
        }),
        figure({
          scenario: 'group-size',
          figure: `${label}, ${rate} writes/s: commit → visible p99`,
          value: p99,
          unit: 'ms',
          baseline: base,
          target: { of: 'value', op: '<=', threshold: 150, text: '≤ 150 ms' },
          detail,
        }),
        figure({
          scenario: 'group-size',
          figure: `${label}, ${rate} writes/s: drain backend CPU per changed row`,
          value: backend === null ? Number.NaN : (backend * 1000) / changed,
          unit: 'ms',
          detail,
        }),
      );
    }
    await trellis.apply('DROP TRANSFORM gs_agg');
  } finally {
    await trellis.shutdown();
  }
  return figures;
}

export const groupSize: Scenario = {
  name: 'group-size',
  title:
    'GROUP BY kept by delta: N rows in 5 groups and in N/10 groups, single-row writes, commit → visible',
  async run({ db, seconds, log }) {
    const figures: Figure[] = [];
    const rates = list('BENCH_GROUP_SIZE_RATES', '200');
    for (const n of list('BENCH_GROUP_SIZE_N', '200000')) {
      for (const groups of [5, Math.max(1, Math.floor(n / 10))]) {
        figures.push(...(await oneShape(db, n, groups, rates, seconds, log)));
      }
    }
    return figures;
  },
};
