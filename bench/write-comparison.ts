import { runLoad, type Workload } from './load.js';
import { type Figure, figure, type Target } from './scenario.js';
import { type BenchDb, checkpoint, converge, median, timed, trellisOn } from './support.js';

/**
 * Two runs of each variant, ABCCBA, so drift and order effects cancel:
 * - bare: a table no transform reads;
 * - capture: a table a live transform reads, its capture triggers firing, with the
 *   workers stopped (the write path itself: what capture costs a writer);
 * - pipeline: the same, with the staging worker and two drain loops running on the same
 *   cores, re-deriving every write as it commits.
 */
const ORDER = ['bare', 'capture', 'pipeline', 'pipeline', 'capture', 'bare'] as const;
type Variant = (typeof ORDER)[number];

export interface WriteComparison {
  db: BenchDb;
  seconds: number;
  log(message: string): void;
  scenario: string;
  /** Prefixes each figure's name, e.g. "10,000 groups". */
  label?: string;
  bareTable: string;
  capturedTable: string;
  /** The live transform reading capturedTable (already defined). */
  target: string;
  workloads: Record<string, (table: string) => Workload>;
  clients: number[];
  /** The target the capture figure must meet, per client count (none: shown for context). */
  targetFor(clients: number): Target | undefined;
}

/**
 * Runs each workload at each client count against the bare and the captured table,
 * alternating (ORDER); each figure is the median of its runs. Between variants the drain
 * catches up (untimed), so every captured run starts from a drained ledger.
 */
export async function compareWrites(c: WriteComparison): Promise<Figure[]> {
  let workers = await trellisOn(c.db.url, { staging: true, drainThreads: 2 });
  let running = true;
  const figures: Figure[] = [];
  try {
    await converge(workers, c.target);
    for (const [op, workload] of Object.entries(c.workloads)) {
      for (const clients of c.clients) {
        const tps: Record<Variant, number[]> = { bare: [], capture: [], pipeline: [] };
        const catchUpMs: number[] = [];
        let tool = '';
        const name = `${c.label ? `${c.label}: ` : ''}${op} ${clients === 1 ? '1 client' : `${clients} clients`}`;
        for (const variant of ORDER) {
          // Workers run only for the pipeline runs; the ledger the capture runs fill is
          // drained (untimed) before the next pipeline run.
          if (variant === 'pipeline' && !running) {
            workers = await trellisOn(c.db.url, { staging: true, drainThreads: 2 });
            running = true;
            catchUpMs.push(await timed(() => converge(workers, c.target)));
          } else if (variant !== 'pipeline' && running) {
            catchUpMs.push(await timed(() => converge(workers, c.target)));
            await workers.shutdown();
            running = false;
          }
          await checkpoint(c.db);
          const result = await runLoad(
            c.db.url,
            workload(variant === 'bare' ? c.bareTable : c.capturedTable),
            clients,
            c.seconds,
          );
          tool = result.tool;
          tps[variant].push(result.tps);
          c.log(`${name} ${variant}: ${result.tps.toFixed(0)} tps`);
        }
        const target = c.targetFor(clients);
        figures.push(
          figure({
            scenario: c.scenario,
            figure: `${name}, capture`,
            value: median(tps.capture),
            unit: 'ops/s',
            baseline: { label: 'bare', value: median(tps.bare) },
            ...(target ? { target } : {}),
            detail: { samples: tps, seconds: c.seconds, tool },
          }),
          figure({
            scenario: c.scenario,
            figure: `${name}, + pipeline on the same cores`,
            value: median(tps.pipeline),
            unit: 'ops/s',
            baseline: { label: 'bare', value: median(tps.bare) },
            detail: { samples: tps, seconds: c.seconds, tool, drainCatchUpMs: catchUpMs },
          }),
        );
      }
    }
  } finally {
    if (running) await workers.shutdown();
  }
  return figures;
}
