import { figure, type Scenario } from './scenario.js';
import { checkpoint, converge, median, timed, trellisOn } from './support.js';

const ROWS = 100_000;
const REPEATS = 3;

/**
 * One 100k-row `INSERT ... SELECT generate_series` into a table a live projection reads,
 * against the same statement into the same table bare: the writer's time only (the drain
 * applies the rows afterwards, and catches up, untimed, before the next run). Alternates
 * bare and captured, three of each, median.
 */
export const bulkInsert: Scenario = {
  name: 'bulk',
  title: `Bulk insert: ${ROWS.toLocaleString('en-US')}-row INSERT ... SELECT, captured vs bare`,
  async run({ db, log }) {
    const ddl = (t: string) =>
      `CREATE TABLE ${t} (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);`;
    await db.sql.unsafe(ddl('bulk_bare') + ddl('bulk_captured'));
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    const ms = { bare: [] as number[], captured: [] as number[] };
    try {
      await trellis.apply('TRANSFORM bulk_view FROM bulk_captured SELECT a AS a, b AS b');
      await converge(trellis, 'bulk_view');
      for (let i = 0; i < REPEATS; i += 1) {
        for (const variant of i % 2
          ? (['captured', 'bare'] as const)
          : (['bare', 'captured'] as const)) {
          const t = variant === 'bare' ? 'bulk_bare' : 'bulk_captured';
          await checkpoint(db);
          const took = await timed(() =>
            db.sql.unsafe(
              `INSERT INTO ${t} (id, a, b)
               SELECT g, g % 1000, 'row ' || g FROM generate_series(${i * ROWS + 1}, ${(i + 1) * ROWS}) g`,
            ),
          );
          ms[variant].push(took);
          log(`bulk insert ${variant}: ${took.toFixed(0)} ms`);
          if (variant === 'captured') await converge(trellis, 'bulk_view');
        }
      }
    } finally {
      await trellis.shutdown();
    }
    return [
      figure({
        scenario: 'bulk',
        figure: `INSERT of ${ROWS.toLocaleString('en-US')} rows`,
        value: median(ms.captured),
        unit: 'ms',
        baseline: { label: 'bare', value: median(ms.bare) },
        target: { of: 'ratio', op: '<=', threshold: 1.3, text: '≤ 1.3× bare' },
        detail: { samples: ms },
      }),
    ];
  },
};
