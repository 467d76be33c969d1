import { ratioFigure } from './alternatives-figure.js';
import {
  ROWS,
  type Shape,
  VARIANTS,
  type Variant,
  type VariantKey,
  withUpkeep,
} from './alternatives-variants.js';
import { interleaved } from './interleave.js';
import { runLoad, type Workload } from './load.js';
import type { Figure } from './scenario.js';
import type { BenchDb } from './support.js';

const CLIENTS = 8;
/** Each variant twice, ABC…CBA. */
const PASSES = 2;

const workloads: Record<'INSERT' | 'UPDATE', (table: string) => Workload> = {
  INSERT: (t) => ({
    pgbench:
      `\\set c random(0, 9999)\n\\set h random(0, 9)\n\\set a random(1, 500)\n` +
      `INSERT INTO ${t} (customer_id, hot_customer_id, amount) VALUES (:c, :h, :a);\n`,
    node: (sql) =>
      sql`INSERT INTO ${sql(t)} (customer_id, hot_customer_id, amount)
          VALUES (${Math.floor(Math.random() * 10_000)}, ${Math.floor(Math.random() * 10)},
                  ${1 + Math.floor(Math.random() * 500)})`,
  }),
  UPDATE: (t) => ({
    pgbench: `\\set id random(1, ${ROWS})\nUPDATE ${t} SET amount = amount + 1 WHERE id = :id;\n`,
    node: (sql) =>
      sql`UPDATE ${sql(t)} SET amount = amount + 1 WHERE id = ${1 + Math.floor(Math.random() * ROWS)}`,
  }),
};

/**
 * Single-row INSERT and UPDATE throughput at 8 clients for every variant, the aggregate
 * grouped by `shape`'s column: each variant's upkeep started (and caught up, untimed)
 * before its run and stopped after, the variants interleaved (interleaved()).
 */
export async function writeFigures(
  db: BenchDb,
  variants: Variant[],
  shape: Shape,
  seconds: number,
  log: (message: string) => void,
): Promise<Figure[]> {
  for (const v of variants) await v.shape(shape);
  const byKey = new Map(variants.map((v) => [v.key, v]));
  const keys = VARIANTS.filter((k) => byKey.has(k));
  const figures: Figure[] = [];
  for (const [op, workload] of Object.entries(workloads)) {
    let tool = '';
    const measured = await interleaved<VariantKey>(
      keys,
      'bare',
      PASSES,
      async (key) => {
        const v = byKey.get(key)!;
        return withUpkeep(v, db, async () => {
          const result = await runLoad(v.url, workload(v.table), CLIENTS, seconds);
          tool = result.tool;
          log(`${shape.label}, ${op}: ${key} ${result.tps.toFixed(0)} ops/s`);
          return result.tps;
        });
      },
      log,
    );
    for (const v of variants) {
      if (v.key === 'bare') continue;
      figures.push(
        ratioFigure({
          name: `${shape.label}, single-row ${op}, ${CLIENTS} clients`,
          unit: 'ops/s',
          variant: v,
          workload: op,
          shape: shape.name,
          measured,
          ...(v.key === 'wal'
            ? {
                target: {
                  of: 'ratio',
                  op: '>=',
                  threshold: shape.threshold,
                  text: `≥ ${shape.threshold.toFixed(2)}× bare`,
                },
              }
            : {}),
          extra: { tool, seconds, clients: CLIENTS },
        }),
      );
    }
  }
  return figures;
}
