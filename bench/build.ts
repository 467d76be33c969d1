import { loadavg } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Trellis } from '../src/engine/index.js';
import { type Figure, figure, type Scenario } from './scenario.js';
import { type BenchDb, checkpoint, timed, trellisOn } from './support.js';

/**
 * `build` (issue #22 item 3): a build against what a user would otherwise run, in the
 * same run: CREATE TABLE AS of the same SELECT plus its unique key index; for a GROUP BY,
 * also the state the build ends with kept per source row (the key map: each row's key,
 * group and aggregate input) and per group, each as CREATE TABLE AS plus its key index.
 * Targets: a projection ≤ 1.3× its baseline, a GROUP BY ≤ 1.5×. Two drain loops.
 * BENCH_BUILD_ROWS (default 300000; the issue's: 1000000).
 */
export const build: Scenario = {
  name: 'build',
  title: 'Builds against CREATE TABLE AS plus key indexes (target and per-row state)',
  async run({ db, log }) {
    const rows = Number(process.env.BENCH_BUILD_ROWS ?? 300_000);
    const groups = Math.max(1, Math.floor(rows / 10));
    await db.sql.unsafe(`
      CREATE TABLE bd_src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL, note text NOT NULL);
      INSERT INTO bd_src SELECT g, g % ${groups}, g % 1000, 'row ' || g FROM generate_series(1, ${rows}) g;
      CREATE INDEX ON bd_src (grp);`);
    await db.sql.unsafe('VACUUM ANALYZE bd_src');
    const n = rows.toLocaleString('en-US');
    const shapes = [
      {
        name: `projection of ${n} rows`,
        statement: 'FROM bd_src SELECT id, v * 2 AS v2, note',
        baseline: [
          'CREATE TABLE bd_b1 AS SELECT id, v * 2 AS v2, note FROM bd_src',
          'ALTER TABLE bd_b1 ADD PRIMARY KEY (id)',
        ],
        threshold: 1.3,
      },
      {
        name: `GROUP BY of ${n} rows into ${groups.toLocaleString('en-US')} groups (kept by delta)`,
        statement: 'FROM bd_src SELECT grp, count(*) AS n, sum(v) AS total GROUP BY grp',
        baseline: [
          'CREATE TABLE bd_b1 AS SELECT grp, count(*) AS n, sum(v) AS total FROM bd_src GROUP BY grp',
          'ALTER TABLE bd_b1 ADD PRIMARY KEY (grp)',
          // The key map: a row per source row, its key, group and aggregate input.
          'CREATE TABLE bd_b2 AS SELECT id, grp, v FROM bd_src',
          'ALTER TABLE bd_b2 ADD PRIMARY KEY (id)',
          // The group states: a row per group.
          'CREATE TABLE bd_b3 AS SELECT grp, count(*) AS n, sum(v) AS s, count(v) AS c FROM bd_src GROUP BY grp',
          'ALTER TABLE bd_b3 ADD PRIMARY KEY (grp)',
        ],
        threshold: 1.5,
      },
    ];
    const figures: Figure[] = [];
    for (const shape of shapes) {
      const baselines: number[] = [];
      const builds: number[] = [];
      let sizes: unknown = null;
      // When each phase was first seen, ms after define(): waiting_to_backfill is capture
      // installed and the first tick, which CREATE TABLE AS does not wait for.
      const phases: Record<string, number> = {};
      // Baseline, build, baseline: the figure is against their mean.
      for (const step of ['baseline', 'build', 'baseline'] as const) {
        await checkpoint(db);
        if (step === 'baseline') {
          const ms = await timed(async () => {
            for (const statement of shape.baseline) await db.sql.unsafe(statement);
          });
          await db.sql.unsafe('DROP TABLE IF EXISTS bd_b1, bd_b2, bd_b3');
          baselines.push(ms);
          log(`${shape.name}: baseline ${ms.toFixed(0)} ms`);
          continue;
        }
        const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
        try {
          const ms = await buildMs(db, trellis, `TRANSFORM bd_view ${shape.statement}`, phases);
          builds.push(ms);
          sizes = await db.sql`
            SELECT c.relname, pg_total_relation_size(c.oid) AS bytes, c.reltuples
              FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
             WHERE c.relkind = 'r' AND (c.relname = 'bd_view'
                   OR (s.nspname = 'trellis' AND c.relname ~ '^(map|groups)_\\d+$'))`;
          log(
            `${shape.name}: build ${ms.toFixed(0)} ms, phases first seen ${JSON.stringify(phases)} (load ${loadavg()[0]!.toFixed(1)})`,
          );
          await trellis.apply('DROP TRANSFORM bd_view');
        } finally {
          await trellis.shutdown();
        }
      }
      const baseline = (baselines[0]! + baselines[1]!) / 2;
      figures.push(
        figure({
          scenario: 'build',
          figure: `build a ${shape.name}`,
          value: builds[0]!,
          unit: 'ms',
          baseline: { label: 'CREATE TABLE AS + key indexes (target and state)', value: baseline },
          target: {
            of: 'ratio',
            op: '<=',
            threshold: shape.threshold,
            text: `≤ ${shape.threshold}× baseline`,
          },
          detail: { baselines, builds, phases, tables: sizes, load: loadavg()[0] },
        }),
      );
    }
    return figures;
  },
};

/** define() until the transform is catching_up or live (the phase polled every 10 ms). */
async function buildMs(
  db: BenchDb,
  trellis: Trellis,
  statement: string,
  seen: Record<string, number>,
): Promise<number> {
  const started = performance.now();
  await trellis.define(statement);
  for (;;) {
    const [row] = await db.sql<{ phase: string; paused: boolean }[]>`
      SELECT p.phase, t.paused_at IS NOT NULL AS paused
        FROM trellis.pipeline p JOIN trellis.transforms t ON t.id = p.transform_id
       WHERE t.target_name = 'bd_view'`;
    if (row) seen[row.phase] ??= performance.now() - started;
    if (row?.paused) throw new Error('the build paused');
    if (row?.phase === 'catching_up' || row?.phase === 'live') break;
    await sleep(10);
  }
  return performance.now() - started;
}
