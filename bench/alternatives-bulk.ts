import type postgres from 'postgres';
import { ratioFigure } from './alternatives-figure.js';
import {
  SHAPES,
  VARIANTS,
  type Variant,
  type VariantKey,
  withUpkeep,
} from './alternatives-variants.js';
import { interleaved } from './interleave.js';
import type { Figure } from './scenario.js';
import { type BenchDb, timed } from './support.js';

const BULK_ROWS = 100_000;
/** ABC…CBA ABC…: three of each. */
const PASSES = 3;
/** trellis-pg's drain runs after the statement; what differs is capture alone. */
const BULK_VARIANTS: VariantKey[] = ['bare', 'trigger', 'wal', 'hand', 'matview'];

/**
 * One 100k-row `INSERT … SELECT` into each variant's table, the writer's time only (the
 * drain catches up after it, untimed; the matview's refresh schedule runs beside it).
 */
export async function bulkFigures(
  db: BenchDb,
  clients: Map<string, postgres.Sql>,
  variants: Variant[],
  log: (message: string) => void,
): Promise<Figure[]> {
  for (const v of variants) await v.shape(SHAPES.wide);
  const byKey = new Map(variants.map((v) => [v.key, v]));
  const keys = VARIANTS.filter((k) => BULK_VARIANTS.includes(k) && byKey.has(k));
  const measured = await interleaved<VariantKey>(
    keys,
    'bare',
    PASSES,
    async (key) => {
      const v = byKey.get(key)!;
      const sql = clients.get(v.url)!;
      return withUpkeep(v, db, async () => {
        const ms = await timed(() =>
          sql.unsafe(
            `INSERT INTO ${v.table} (customer_id, hot_customer_id, amount)
             SELECT g % ${SHAPES.wide.groups}, g % ${SHAPES.hot.groups}, g % 500
               FROM generate_series(1, ${BULK_ROWS}) g`,
          ),
        );
        log(`bulk INSERT of ${BULK_ROWS.toLocaleString('en-US')} rows: ${key} ${ms.toFixed(0)} ms`);
        return ms;
      });
    },
    log,
  );
  return variants
    .filter((v) => v.key !== 'bare' && keys.includes(v.key))
    .map((v) =>
      ratioFigure({
        name: `${SHAPES.wide.label}, one ${BULK_ROWS.toLocaleString('en-US')}-row INSERT … SELECT`,
        unit: 'ms',
        variant: v,
        workload: 'bulk',
        shape: SHAPES.wide.name,
        measured,
        ...(v.key === 'trigger' || v.key === 'wal'
          ? { target: { of: 'ratio', op: '<=', threshold: 1.1, text: '≤ 1.1× bare' } }
          : {}),
        extra: { rows: BULK_ROWS },
      }),
    );
}
