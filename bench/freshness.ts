import { measureFreshness } from './freshness-measure.js';
import { figure, type Scenario } from './scenario.js';
import { converge, percentile, trellisOn } from './support.js';

const RATE = 1_000;
const SECONDS = 10;
const WRITERS = 8;
const POLL_MS = 5;

/**
 * Commit → visible in the target at a steady write rate (see measureFreshness): WRITERS
 * clients insert one row per statement into the source of a live projection, paced to
 * RATE a second in all; a reader polls every POLL_MS for ids it has not seen yet in the
 * target and, in the same query, in the source itself (the baseline: what the measurement
 * alone adds, about the polling interval).
 */
export const freshness: Scenario = {
  name: 'freshness',
  title: `Freshness: commit → visible at ${RATE.toLocaleString('en-US')} writes/s`,
  async run({ db, log }) {
    await db.sql.unsafe(`CREATE TABLE fresh_src (id int PRIMARY KEY, a int NOT NULL)`);
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    let result: Awaited<ReturnType<typeof measureFreshness>>;
    try {
      await trellis.apply('TRANSFORM fresh_view FROM fresh_src SELECT a AS a');
      await converge(trellis, 'fresh_view');
      result = await measureFreshness(
        db.url,
        {
          write: (sql, id) => sql`INSERT INTO fresh_src (id, a) VALUES (${id}, ${id % 1000})`,
          poll: async (sql, { lowTarget, lowSource }) => {
            const rows = await sql<{ t: boolean; id: number }[]>`
              SELECT true AS t, id FROM fresh_view WHERE id >= ${lowTarget}
              UNION ALL
              SELECT false, id FROM fresh_src WHERE id >= ${lowSource}`;
            return {
              target: rows.filter((r) => r.t).map((r) => r.id),
              source: rows.filter((r) => !r.t).map((r) => r.id),
            };
          },
        },
        { rate: RATE, seconds: SECONDS, writers: WRITERS, pollMs: POLL_MS },
      );
    } finally {
      await trellis.shutdown();
    }
    const { target, source, writes } = result;
    log(
      `freshness: ${result.writesPerSecond.toFixed(0)} writes/s; target p50 ${percentile(target, 50).toFixed(0)} ms, p99 ${percentile(target, 99).toFixed(0)} ms`,
    );
    const detail = {
      writesPerSecond: result.writesPerSecond,
      writes,
      seenInTarget: target.length,
      maxMs: target.at(-1),
      pollMs: POLL_MS,
      writers: WRITERS,
    };
    return [50, 99].map((p) =>
      figure({
        scenario: 'freshness',
        figure: `commit → visible, p${p}`,
        value: target.length < writes ? Number.POSITIVE_INFINITY : percentile(target, p),
        unit: 'ms',
        baseline: { label: 'visible in source', value: percentile(source, p) },
        ...(p === 99
          ? { target: { of: 'value', op: '<', threshold: 250, text: 'p99 < 250 ms' } }
          : {}),
        detail,
      }),
    );
  },
};
