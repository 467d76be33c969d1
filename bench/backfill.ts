import { setTimeout as sleep } from 'node:timers/promises';
import type { Trellis } from '../src/engine/index.js';
import { type Figure, figure, type Scenario } from './scenario.js';
import { type BenchDb, checkpoint, median, Samples, spread, timed, trellisOn } from './support.js';

const ROWS = 1_000_000;
/** Rounds of (CTAS, builds, CTAS), interleaved: each figure is the median of its rounds. */
const ROUNDS = 2;

interface Shape {
  name: string;
  /** The statement's body after `TRANSFORM <target>`. */
  statement: string;
  /** The same as a plain SELECT, with the target's key columns. */
  select: string;
  text: string;
}

const SHAPES: Shape[] = [
  {
    name: 'projection',
    statement: 'FROM bf_src SELECT a * 2 AS a2, b',
    select: 'SELECT id, a * 2 AS a2, b FROM bf_src',
    text: `projection of ${ROWS.toLocaleString('en-US')} rows`,
  },
  {
    name: 'group-by',
    statement: 'FROM bf_src SELECT a, count(*) AS n, sum(id) AS total GROUP BY a',
    select: 'SELECT a, count(*) AS n, sum(id) AS total FROM bf_src GROUP BY a',
    text: `GROUP BY of ${ROWS.toLocaleString('en-US')} rows into 1,000 groups`,
  },
];

/** Loop counts a projection is built with (a GROUP BY builds in one statement: 2). */
const LOOPS = [1, 2, 4];

/**
 * Builds, from define() until the transform is catching_up or live (the phase polled in
 * the catalog every 10 ms, so the polling costs next to nothing), against CREATE TABLE AS
 * of the same SELECT, measured in the same rounds: CTAS, every build, CTAS again.
 * A projection is built with 1, 2 and 4 drain loops in the bench process (its chunks are
 * filled by several loops at once, ADR 0028); a GROUP BY with 2 (one statement fills it).
 */
export const backfill: Scenario = {
  name: 'backfill',
  title: `Builds: ${ROWS.toLocaleString('en-US')} rows vs CREATE TABLE AS of the same SELECT`,
  async run({ db, log }) {
    await db.sql.unsafe(`
      CREATE TABLE bf_src (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
      INSERT INTO bf_src SELECT g, g % 1000, 'row ' || g FROM generate_series(1, ${ROWS}) g;`);
    // Hint bits and the visibility map set now, so neither side pays for them.
    await db.sql.unsafe('VACUUM ANALYZE bf_src');
    const ctas = new Samples<number>();
    const builds = new Samples<number>();
    const phases = new Samples<Record<string, number>>();
    let n = 0;
    const runCtas = async (shape: Shape) => {
      n += 1;
      await checkpoint(db);
      const ms = await timed(() => db.sql.unsafe(`CREATE TABLE bf_ctas_${n} AS ${shape.select}`));
      await db.sql.unsafe(`DROP TABLE bf_ctas_${n}`);
      ctas.add(shape.name, ms);
      log(`${shape.name}: CREATE TABLE AS ${ms.toFixed(0)} ms`);
    };
    for (let round = 0; round < ROUNDS; round += 1) {
      for (const shape of SHAPES) {
        await runCtas(shape);
        for (const loops of shape.name === 'projection' ? LOOPS : [2]) {
          const key = `${shape.name}/${loops}`;
          const trellis = await trellisOn(db.url, { staging: true, drainThreads: loops });
          try {
            const { ms, seen } = await build(db, trellis, shape);
            builds.add(key, ms);
            phases.add(key, seen);
            log(`${shape.name}: build with ${loops} drain loop(s) ${ms.toFixed(0)} ms`);
            await trellis.apply('DROP TRANSFORM bf_view');
          } finally {
            await trellis.shutdown();
          }
        }
        await runCtas(shape);
      }
    }
    const figures: Figure[] = [];
    for (const shape of SHAPES) {
      const baseline = ctas.of(shape.name);
      for (const loops of shape.name === 'projection' ? LOOPS : [2]) {
        const samples = builds.of(`${shape.name}/${loops}`);
        figures.push(
          figure({
            scenario: 'backfill',
            figure: `build a ${shape.text}, ${loops} drain loop${loops > 1 ? 's' : ''}`,
            value: median(samples),
            unit: 'ms',
            baseline: { label: 'CREATE TABLE AS', value: median(baseline) },
            ...(loops === 2
              ? { target: { of: 'ratio', op: '<=', threshold: 1.5, text: '≤ 1.5× CTAS' } }
              : {}),
            detail: {
              samples,
              spread: spread(samples),
              ctasMs: baseline,
              ctasSpread: spread(baseline),
              // A baseline that moved this much between runs makes the ratio unreliable.
              baselineMoved: spread(baseline) > 0.15,
              phaseFirstSeenMs: phases.of(`${shape.name}/${loops}`),
            },
          }),
        );
      }
    }
    return figures;
  },
};

/** define() until catching_up (or live); when each phase was first seen. */
async function build(
  db: BenchDb,
  trellis: Trellis,
  shape: Shape,
): Promise<{ ms: number; seen: Record<string, number> }> {
  await checkpoint(db);
  const seen: Record<string, number> = {};
  const started = performance.now();
  await trellis.define(`TRANSFORM bf_view ${shape.statement}`);
  for (;;) {
    const [row] = await db.sql<{ phase: string; paused: boolean }[]>`
      SELECT p.phase, t.paused_at IS NOT NULL AS paused
        FROM trellis.pipeline p JOIN trellis.transforms t ON t.id = p.transform_id
       WHERE t.target_name = 'bf_view'`;
    if (row) seen[row.phase] ??= performance.now() - started;
    if (row?.paused) throw new Error('the build paused');
    if (row?.phase === 'catching_up' || row?.phase === 'live') break;
    await sleep(10);
  }
  return { ms: performance.now() - started, seen };
}
