import { loadavg } from 'node:os';
import { type Figure, figure, type Scenario } from './scenario.js';
import { checkpoint, converge, timed, trellisOn } from './support.js';

/**
 * `burst` (issue #22): a GROUP BY kept by delta (`count(*)`, `sum(v)`) over G groups of
 * one row each; 1 %, 10 % and 50 % of the groups changed at once while the transform is
 * paused, then RESUME and the time until it has converged, against a full recompute of
 * the aggregate (CREATE TABLE AS of the same SELECT) measured in the same run. Target:
 * never above 1.0× the recompute, 1 % at most 0.1×. BENCH_BURST_GROUPS (default 200000;
 * the issue's: 1000000).
 */
export const burst: Scenario = {
  name: 'burst',
  title: 'Bursts of 1 %, 10 %, 50 % of the groups changed at once, against a full recompute',
  async run({ db, log }) {
    const groups = Number(process.env.BENCH_BURST_GROUPS ?? 200_000);
    await db.sql.unsafe(`
      CREATE TABLE bu_src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL);
      INSERT INTO bu_src SELECT g, g, g % 1000 FROM generate_series(1, ${groups}) g;
      CREATE INDEX ON bu_src (grp);
      ANALYZE bu_src;`);
    const select = 'SELECT grp, count(*) AS n, sum(v) AS total FROM bu_src GROUP BY grp';
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    const figures: Figure[] = [];
    try {
      await trellis.apply(`TRANSFORM bu_agg FROM bu_src ${select.replace(' FROM bu_src', '')}`);
      await converge(trellis, 'bu_agg');
      for (const pct of [1, 10, 50]) {
        await checkpoint(db);
        await db.sql.unsafe('DROP TABLE IF EXISTS bu_recompute');
        const recomputeMs = await timed(() =>
          db.sql.unsafe(`CREATE TABLE bu_recompute AS ${select}`),
        );
        await trellis.apply('PAUSE TRANSFORM bu_agg');
        await db.sql.unsafe(
          `UPDATE bu_src SET v = v + 1, grp = CASE WHEN id % 2 = 0 THEN grp ELSE -grp END WHERE id % 100 < ${pct}`,
        );
        await checkpoint(db);
        const ms = await timed(async () => {
          await trellis.apply('RESUME TRANSFORM bu_agg');
          await converge(trellis, 'bu_agg');
        });
        const last = (await trellis.status('bu_agg')).lastApply;
        log(
          `${pct} % of ${groups.toLocaleString('en-US')} groups: ${ms.toFixed(0)} ms (${last?.mode}), recompute ${recomputeMs.toFixed(0)} ms: ${(ms / recomputeMs).toFixed(2)}× (load ${loadavg()[0]!.toFixed(1)})`,
        );
        figures.push(
          figure({
            scenario: 'burst',
            figure: `${pct} % of ${groups.toLocaleString('en-US')} groups changed at once → converged`,
            value: ms,
            unit: 'ms',
            baseline: { label: 'full recompute (CREATE TABLE AS)', value: recomputeMs },
            target:
              pct === 1
                ? { of: 'ratio', op: '<=', threshold: 0.1, text: '≤ 0.1× recompute' }
                : { of: 'ratio', op: '<=', threshold: 1, text: '≤ 1.0× recompute' },
            detail: { mode: last?.mode, estimate: last?.estimate, load: loadavg()[0] },
          }),
        );
      }
    } finally {
      await trellis.shutdown();
    }
    return figures;
  },
};
