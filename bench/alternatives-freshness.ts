import type postgres from 'postgres';
import {
  LABELS,
  REFRESH_MS,
  SHAPES,
  type Variant,
  type VariantKey,
} from './alternatives-variants.js';
import { type FreshnessResult, measureFreshness } from './freshness-measure.js';
import { interleaved } from './interleave.js';
import { type Figure, figure } from './scenario.js';
import { median, percentile, spread } from './support.js';

const RATE = 1_000;
const SECONDS = 10;
const WRITERS = 8;
const POLL_MS = 5;
/** ABC…CBA: each variant twice. */
const PASSES = 2;
/** trellis-pg with its drain running, and the two alternatives that keep an aggregate. */
const FRESH_VARIANTS: VariantKey[] = ['trigger+pipeline', 'wal+pipeline', 'hand', 'matview'];
/** Quantiles kept for the charts (every 0.5%), rather than every lag. */
const QUANTILES = Array.from({ length: 201 }, (_, i) => i / 2);

/**
 * Commit → visible in the aggregate at 1,000 single-row INSERTs a second (the freshness
 * scenario's measurement, measureFreshness), for each variant that keeps one. Write i
 * goes to customer i − 1 (10,000 writes, 10,000 customers: one write per group), so it is
 * visible once its group's count is one more than before the run.
 */
export async function freshnessFigures(
  clients: Map<string, postgres.Sql>,
  variants: Variant[],
  log: (message: string) => void,
): Promise<Figure[]> {
  const groups = SHAPES.wide.groups;
  if (RATE * SECONDS > groups) throw new Error('one write per group: RATE × SECONDS ≤ groups');
  for (const v of variants) await v.shape(SHAPES.wide);
  const byKey = new Map(variants.map((v) => [v.key, v]));
  const keys = FRESH_VARIANTS.filter((k) => byKey.has(k));
  const runs = new Map<VariantKey, FreshnessResult[]>(keys.map((k) => [k, []]));
  await interleaved<VariantKey>(
    keys,
    null,
    PASSES,
    async (key) => {
      const v = byKey.get(key)!;
      const result = await freshnessRun(clients.get(v.url)!, v);
      runs.get(key)!.push(result);
      log(
        `freshness, ${key}: ${result.writesPerSecond.toFixed(0)} writes/s, p50 ${percentile(result.target, 50).toFixed(0)} ms, p99 ${percentile(result.target, 99).toFixed(0)} ms`,
      );
      return percentile(result.target, 99);
    },
    log,
  );
  const figures: Figure[] = [];
  for (const key of keys) {
    const results = runs.get(key)!;
    const pooled = results.flatMap((r) => r.target).sort((a, b) => a - b);
    const source = results.flatMap((r) => r.source).sort((a, b) => a - b);
    const v = byKey.get(key)!;
    const notes = { ...v.notes };
    for (const k of Object.keys(v.notes)) delete v.notes[k];
    for (const p of [50, 99]) {
      // A write never seen in the target makes the figure infinite, not a lag.
      const perRun = results.map((r) =>
        r.target.length < r.writes ? Number.POSITIVE_INFINITY : percentile(r.target, p),
      );
      const isTrellis = key === 'trigger+pipeline' || key === 'wal+pipeline';
      figures.push(
        figure({
          scenario: 'alternatives',
          figure: `freshness at ${RATE.toLocaleString('en-US')} writes/s, commit → visible, p${p}: ${LABELS[key]}`,
          value: median(perRun),
          unit: 'ms',
          // What the polling itself adds: not divided by, so not watched for moving.
          baseline: { label: 'visible in source', value: percentile(source, p) },
          ...(p === 99 && isTrellis
            ? { target: { of: 'value', op: '<', threshold: 250, text: 'p99 < 250 ms' } }
            : {}),
          detail: {
            variant: key,
            label: LABELS[key],
            workload: `freshness p${p}`,
            shape: SHAPES.wide.name,
            samples: perRun,
            spread: spread(perRun),
            writesPerSecond: results.map((r) => r.writesPerSecond),
            seenInTarget: results.map((r) => r.target.length),
            writes: results.map((r) => r.writes),
            // Every 0.5% of the lags of all runs, and of the source's (the polling floor).
            ...(p === 99
              ? {
                  quantiles: QUANTILES.map((q) => ({
                    q,
                    ms: percentile(pooled, q),
                    sourceMs: percentile(source, q),
                  })),
                }
              : {}),
            pollMs: POLL_MS,
            writers: WRITERS,
            ...(key === 'matview' ? { refreshPeriodMs: REFRESH_MS } : {}),
            ...notes,
          },
        }),
      );
    }
  }
  return figures;
}

/** One run: counts read before (nothing writes then), the variant's upkeep running. */
async function freshnessRun(sql: postgres.Sql, v: Variant): Promise<FreshnessResult> {
  const target = v.target!;
  const base = new Int32Array(SHAPES.wide.groups);
  for (const r of await sql<{ g: number; n: number }[]>`
      SELECT customer_id AS g, count(*)::int AS n FROM ${sql(v.table)} GROUP BY 1`) {
    base[r.g] = r.n;
  }
  const [row] = await sql<{ max: number }[]>`SELECT max(id)::int AS max FROM ${sql(v.table)}`;
  const baseId = row!.max;
  await v.start();
  try {
    return await measureFreshness(
      v.url,
      {
        write: (w, i) =>
          w`INSERT INTO ${w(v.table)} (id, customer_id, hot_customer_id, amount)
            VALUES (${baseId + i}, ${i - 1}, ${i % SHAPES.hot.groups}, 1)`,
        poll: async (r, { lowTarget, lowSource, issued }) => {
          const rows = await r<{ t: boolean; i: number; n: number }[]>`
            SELECT true AS t, customer_id + 1 AS i, n::int AS n FROM ${r(target)}
             WHERE customer_id >= ${lowTarget - 1} AND customer_id < ${issued}
            UNION ALL
            SELECT false, (id - ${baseId})::int, 0 FROM ${r(v.table)}
             WHERE id >= ${baseId + lowSource}`;
          return {
            target: rows.filter((x) => x.t && x.n > base[x.i - 1]!).map((x) => x.i),
            source: rows.filter((x) => !x.t).map((x) => x.i),
          };
        },
      },
      { rate: RATE, seconds: SECONDS, writers: WRITERS, pollMs: POLL_MS },
    );
  } finally {
    await v.stop();
    // The writes chose their ids: the identity goes on after them.
    await sql`SELECT setval(pg_get_serial_sequence(${v.table}, 'id'), (SELECT max(id) FROM ${sql(v.table)}))`;
  }
}
