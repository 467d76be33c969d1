import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Figure, figure, type Scenario } from './scenario.js';
import {
  type BenchDb,
  checkpoint,
  converge,
  median,
  Samples,
  spread,
  timed,
  trellisOn,
} from './support.js';

/** Changed keys per burst of the projection. */
const PROJECTION_KEYS = 200_000;
/** The GROUP BY: 1M rows in 500,000 groups of two; a burst changes one row in each of 40,000. */
const GB_ROWS = 1_000_000;
const GB_GROUPS = 500_000;
const GB_CHANGED = 40_000;
const ROUNDS = 2;

/** Drain loops: in the bench process, and in a second process. */
interface Layout {
  here: number;
  other: number;
}
const LAYOUTS: Layout[] = [
  { here: 1, other: 0 },
  { here: 2, other: 0 },
  { here: 4, other: 0 },
  { here: 1, other: 1 },
  { here: 2, other: 2 },
];

const label = (l: Layout) =>
  l.other === 0
    ? `${l.here} loop${l.here > 1 ? 's' : ''}, one process`
    : `${l.here + l.other} loops, two processes`;

interface Shape {
  name: string;
  target: string;
  statement: string;
  keys: number;
  /** Makes the burst (the transform is paused meanwhile). */
  burst: string;
  /** One set-based statement doing the burst's writes into a plain copy: the baseline. */
  baseline: (db: BenchDb) => Promise<number>;
  unit: string;
}

const SHAPES: Shape[] = [
  {
    name: 'projection',
    target: 'so_proj_dst',
    statement: 'TRANSFORM so_proj_dst FROM so_proj SELECT a * 2 AS a2, b',
    keys: PROJECTION_KEYS,
    burst: 'UPDATE so_proj SET a = a + 1',
    unit: 'keys/s',
    baseline: (db) =>
      timed(() =>
        db.sql.unsafe(`
          INSERT INTO so_proj_copy AS t (id, a2, b) SELECT id, a * 2 + 1, b FROM so_proj
          ON CONFLICT (id) DO UPDATE SET a2 = EXCLUDED.a2, b = EXCLUDED.b
           WHERE t.a2 IS DISTINCT FROM EXCLUDED.a2 OR t.b IS DISTINCT FROM EXCLUDED.b`),
      ),
  },
  {
    name: 'group-by',
    target: 'so_gb_dst',
    statement:
      'TRANSFORM so_gb_dst FROM so_gb SELECT grp, sum(amount) AS total, count(*) AS n GROUP BY grp',
    keys: GB_CHANGED,
    burst: `UPDATE so_gb SET amount = amount + 1 WHERE id <= ${GB_CHANGED}`,
    unit: 'groups/s',
    baseline: (db) =>
      timed(() =>
        db.sql.unsafe(`
          INSERT INTO so_gb_copy AS t (grp, total, n)
          SELECT grp, sum(amount) + 1, count(*) FROM so_gb
           WHERE grp IN (SELECT grp FROM so_gb WHERE id <= ${GB_CHANGED}) GROUP BY grp
          ON CONFLICT (grp) DO UPDATE SET total = EXCLUDED.total, n = EXCLUDED.n
           WHERE (t.total, t.n) IS DISTINCT FROM (EXCLUDED.total, EXCLUDED.n)`),
      ),
  },
];

/** A second app process running `loops` drain loops; resolves once it is draining. */
async function drainProcess(url: string, loops: number): Promise<ChildProcess> {
  const here = dirname(fileURLToPath(import.meta.url));
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', join(here, 'drain-process.ts'), url, String(loops)],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const [chunk] = (await once(child.stdout!, 'data')) as [Buffer];
  if (!chunk.toString().includes('ready')) throw new Error('the drain process did not start');
  return child;
}

/**
 * Drain throughput as drain loops are added, in one process and across two (issue #14
 * item 3): a transform paused while a burst of changes is written, then resumed; changed
 * keys (a GROUP BY: groups) applied per second, for 1, 2 and 4 loops in the bench
 * process and for 2 and 4 loops split over two processes. The staging worker runs in the
 * bench process. Each layout runs ROUNDS times, interleaved; the baseline is one
 * set-based statement doing the same writes into a plain table, measured in each round.
 */
export const scaleOut: Scenario = {
  name: 'scale-out',
  title: 'Scale-out: drain throughput with 1, 2 and 4 loops, in one process and in two',
  async run({ db, log }) {
    await db.sql.unsafe(`
      CREATE TABLE so_proj (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
      INSERT INTO so_proj SELECT g, g % 1000, 'row ' || g FROM generate_series(1, ${PROJECTION_KEYS}) g;
      CREATE TABLE so_proj_copy (id int PRIMARY KEY, a2 int, b text);
      INSERT INTO so_proj_copy SELECT id, a * 2, b FROM so_proj;
      CREATE TABLE so_gb (id int PRIMARY KEY, grp int NOT NULL, amount int NOT NULL);
      INSERT INTO so_gb SELECT g, g % ${GB_GROUPS}, g % 500 FROM generate_series(1, ${GB_ROWS}) g;
      CREATE INDEX ON so_gb (grp);
      CREATE TABLE so_gb_copy (grp int PRIMARY KEY, total bigint, n bigint);
      INSERT INTO so_gb_copy SELECT grp, sum(amount), count(*) FROM so_gb GROUP BY grp;`);
    await db.sql.unsafe('VACUUM ANALYZE');
    const rates = new Samples<number>();
    const baselines = new Samples<number>();
    const modes = new Samples<string>();
    {
      const setup = await trellisOn(db.url, { staging: true, drainThreads: 2 });
      try {
        for (const shape of SHAPES) {
          await setup.apply(shape.statement);
          await converge(setup, shape.target);
        }
      } finally {
        await setup.shutdown();
      }
    }
    for (let round = 0; round < ROUNDS; round += 1) {
      for (const shape of SHAPES) {
        await checkpoint(db);
        const baseMs = await shape.baseline(db);
        baselines.add(shape.name, shape.keys / (baseMs / 1000));
        for (const layout of round % 2 ? [...LAYOUTS].reverse() : LAYOUTS) {
          const other = layout.other > 0 ? await drainProcess(db.url, layout.other) : undefined;
          const trellis = await trellisOn(db.url, { staging: true, drainThreads: layout.here });
          try {
            await trellis.apply(`PAUSE TRANSFORM ${shape.target}`);
            await db.sql.unsafe(shape.burst);
            await checkpoint(db);
            const ms = await timed(async () => {
              await trellis.apply(`RESUME TRANSFORM ${shape.target}`);
              await converge(trellis, shape.target);
            });
            const rate = shape.keys / (ms / 1000);
            rates.add(`${shape.name}/${label(layout)}`, rate);
            modes.add(shape.name, (await trellis.status(shape.target)).lastApply?.mode ?? '-');
            log(`${shape.name}, ${label(layout)}: ${rate.toFixed(0)} ${shape.unit}`);
          } finally {
            await trellis.shutdown();
            if (other) {
              other.kill('SIGTERM');
              await once(other, 'exit');
            }
          }
        }
      }
    }
    const figures: Figure[] = [];
    for (const shape of SHAPES) {
      const base = baselines.of(shape.name);
      for (const layout of LAYOUTS) {
        const samples = rates.of(`${shape.name}/${label(layout)}`);
        const target =
          shape.name === 'projection'
            ? {
                of: 'value' as const,
                op: '>=' as const,
                threshold: 50_000,
                text: '≥ 50,000 keys/s',
              }
            : {
                of: 'value' as const,
                op: '>=' as const,
                threshold: 20_000,
                text: '≥ 20,000 groups/s',
              };
        figures.push(
          figure({
            scenario: 'scale-out',
            figure: `${shape.name}: ${shape.keys.toLocaleString('en-US')} changed keys, ${label(layout)}`,
            value: median(samples),
            unit: shape.unit,
            baseline: { label: 'one set-based statement', value: median(base) },
            target,
            detail: {
              samples,
              spread: spread(samples),
              baselineSamples: base,
              baselineMoved: spread(base) > 0.15,
              appliedAs: modes.of(shape.name),
            },
          }),
        );
      }
    }
    return figures;
  },
};
