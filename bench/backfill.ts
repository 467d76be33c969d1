import { setTimeout as sleep } from 'node:timers/promises';
import { figure, type Scenario } from './scenario.js';
import { checkpoint, median, timed, trellisOn } from './support.js';

const ROWS = 1_000_000;
/** What the transform derives (its target is keyed by id). */
const SELECT = 'SELECT id, a * 2 AS a2, b FROM bf_src';

/**
 * Backfill of a 1M-row projection, from define() until its status is catching_up or
 * live (polled every 25 ms, with the staging worker and two drain loops already running),
 * against CREATE TABLE AS of the same SELECT, once before and once after (median).
 */
export const backfill: Scenario = {
  name: 'backfill',
  title: `Backfill: ${ROWS.toLocaleString('en-US')} rows vs CREATE TABLE AS`,
  async run({ db, log }) {
    await db.sql.unsafe(`
      CREATE TABLE bf_src (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
      INSERT INTO bf_src SELECT g, g % 1000, 'row ' || g FROM generate_series(1, ${ROWS}) g;`);
    // Hint bits and the visibility map set now, so neither side pays for them.
    await db.sql.unsafe('VACUUM ANALYZE bf_src');
    const ctas = async (n: number) => {
      await checkpoint(db);
      const ms = await timed(() => db.sql.unsafe(`CREATE TABLE bf_ctas_${n} AS ${SELECT}`));
      const keyMs = await timed(() =>
        db.sql.unsafe(`ALTER TABLE bf_ctas_${n} ADD PRIMARY KEY (id)`),
      );
      log(`CREATE TABLE AS: ${ms.toFixed(0)} ms (+ ${keyMs.toFixed(0)} ms for its primary key)`);
      return { ms, keyMs };
    };

    const before = await ctas(1);
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    const phases: Record<string, number> = {};
    let ms: number;
    try {
      await checkpoint(db);
      const started = performance.now();
      await trellis.define('TRANSFORM bf_view FROM bf_src SELECT a * 2 AS a2, b');
      for (;;) {
        const { status } = await trellis.status('bf_view');
        phases[status] ??= performance.now() - started;
        if (status === 'catching_up' || status === 'live') break;
        if (status === 'paused') throw new Error('the backfill paused');
        await sleep(25);
      }
      ms = performance.now() - started;
    } finally {
      await trellis.shutdown();
    }
    log(`backfill: ${ms.toFixed(0)} ms`);
    const after = await ctas(2);
    return [
      figure({
        scenario: 'backfill',
        figure: `backfill ${ROWS.toLocaleString('en-US')} rows`,
        value: ms,
        unit: 'ms',
        baseline: { label: 'CREATE TABLE AS', value: median([before.ms, after.ms]) },
        target: { of: 'ratio', op: '<=', threshold: 1.5, text: '≤ 1.5× CTAS' },
        detail: {
          ctasMs: [before.ms, after.ms],
          ctasPrimaryKeyMs: [before.keyMs, after.keyMs],
          phaseFirstSeenMs: phases,
        },
      }),
    ];
  },
};
