import { setTimeout as sleep } from 'node:timers/promises';
import type { SelfCheckJob } from '../src/engine/index.js';
import { figure, type Scenario } from './scenario.js';
import { median, timed, trellisOn } from './support.js';

const ROWS = 1_000_000;

/**
 * A full self-check of a 1M-row projection (a live target, no writes), from selfCheck()
 * until the job is done (queueing included: the worker is in this process), in rows
 * compared per second; against one `EXCEPT ALL` of the target and its definition over
 * the whole table (the definition less the target, counted), once before and once after
 * (median). The check does more than that baseline: both directions, in chunks of keys
 * each in its own snapshot, with the findings sorted from lag.
 */
export const selfCheck: Scenario = {
  name: 'self-check',
  title: `Self-check: ${ROWS.toLocaleString('en-US')} rows vs one EXCEPT ALL`,
  async run({ db, log }) {
    await db.sql.unsafe(`
      CREATE TABLE sc_src (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
      INSERT INTO sc_src SELECT g, g % 1000, 'row ' || g FROM generate_series(1, ${ROWS}) g;`);
    await db.sql.unsafe('VACUUM ANALYZE sc_src');
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    try {
      await trellis.define('TRANSFORM sc_view FROM sc_src SELECT a * 2 AS a2, b');
      for (;;) {
        const { status } = await trellis.status('sc_view');
        if (status === 'live') break;
        if (status === 'paused') throw new Error('the backfill paused');
        await sleep(100);
      }
      await db.sql.unsafe('VACUUM ANALYZE sc_view');
      const exceptAll = async () => {
        const ms = await timed(() =>
          db.sql.unsafe(`SELECT count(*) FROM (
              SELECT id, a * 2 AS a2, b FROM sc_src EXCEPT ALL SELECT id, a2, b FROM sc_view) x`),
        );
        log(`EXCEPT ALL: ${ms.toFixed(0)} ms`);
        return ms;
      };
      const before = await exceptAll();
      const started = performance.now();
      const { id } = await trellis.selfCheck('sc_view', 'full');
      let job: SelfCheckJob | null = null;
      for (;;) {
        job = await trellis.selfCheckJob(id);
        if (!job || (job.state !== 'queued' && job.state !== 'running')) break;
        await sleep(20);
      }
      const ms = performance.now() - started;
      if (job?.state !== 'done' || job.report?.outcome !== 'consistent') {
        throw new Error(`the check did not finish consistent: ${JSON.stringify(job)}`);
      }
      log(`self-check: ${ms.toFixed(0)} ms, ${job.report.rowsCompared} rows`);
      const after = await exceptAll();
      const baselineMs = median([before, after]);
      return [
        figure({
          scenario: 'self-check',
          figure: `full check of ${ROWS.toLocaleString('en-US')} rows`,
          value: job.report.rowsCompared / (ms / 1000),
          unit: 'rows/s',
          baseline: { label: 'one EXCEPT ALL', value: ROWS / (baselineMs / 1000) },
          detail: {
            checkMs: ms,
            jobRunMs: (job.finishedAt?.getTime() ?? 0) - (job.startedAt?.getTime() ?? 0),
            exceptAllMs: [before, after],
          },
        }),
      ];
    } finally {
      await trellis.shutdown();
    }
  },
};
