import { mapKeys } from './aggregate-sql.js';
import type { TransformPlan } from './plan.js';
import {
  col,
  list,
  q,
  restrictedWhere,
  selectList,
  tuple,
  typedParam,
  writtenColumns,
} from './sql-parts.js';

/** SQL of a backfill: keyset chunks over the FROM (driving) table's key. */

function drivingKeyColumns(plan: TransformPlan): string[] {
  const driving = plan.sources[0]!;
  return driving.keyColumns.map((k) => col(driving.alias, k));
}

/**
 * Every chunk's upper bound (a text[] each, in key order: the key of every `$1`-th
 * driving row) and the number of driving rows, in one pass over the driving table's key
 * (an index-only scan when its visibility map is set).
 */
export function chunkBoundsSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  const keys = driving.keyColumns.map((k) => col('d', k));
  const named = keys.map((_, i) => `k${i + 1}`);
  // The key is turned into text only for the rows that end a chunk (FILTER is checked
  // before the aggregate's argument is computed): for every row it would cost more than
  // the scan.
  return `SELECT array_agg(ARRAY[${list(named.map((k) => `${k}::text`))}] ORDER BY n)
                 FILTER (WHERE n % $1::int = 0) AS ends,
               count(*) AS total
    FROM (SELECT ${list(keys.map((k, i) => `${k} AS ${named[i]}`))},
                 row_number() OVER (ORDER BY ${list(keys)}) AS n
            FROM ${driving.table} d) numbered`;
}

/**
 * The driving table's key histogram (its statistics, from ANALYZE: about a hundred values
 * splitting the rows evenly), as text[] bounds sorted the way the key compares, and the
 * table's row estimate: chunk bounds for a one-column key without reading the table.
 * `$1` is the table, `$2` the key column. No row of bounds when it has no statistics.
 */
export function histogramBoundsSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  return `SELECT array_agg(ARRAY[b::text] ORDER BY b) AS ends,
               (SELECT c.reltuples FROM pg_class c WHERE c.oid = $1::regclass)::float8 AS rows
    FROM (SELECT DISTINCT (v)::${driving.keyTypes[0]} AS b
            FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
           CROSS JOIN LATERAL unnest(s.histogram_bounds::text::text[]) AS v
           WHERE c.oid = $1::regclass AND s.attname = $2
             AND s.inherited = (c.relkind = 'p')) bounds`;
}

/**
 * The key that ends a chunk of `$2` driving rows (a GROUP BY build's repair) after key `$1` (a text[], or
 * NULL for the first chunk), or no row when fewer remain.
 */
export function chunkEndSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  const keys = driving.keyColumns.map((k) => col('d', k));
  const typed = driving.keyTypes.map((type, i) => `(($1::text[])[${i + 1}])::${type}`);
  return `SELECT ARRAY[${list(keys.map((k) => `${k}::text`))}] AS upto
    FROM ${driving.table} d
   WHERE $1::text[] IS NULL OR ${tuple(keys)} > ${tuple(typed)}
   ORDER BY ${list(keys)}
  OFFSET $2::int - 1 LIMIT 1`;
}

/**
 * Fills the target for driving keys after `$1` up to and including `$2` (either NULL for
 * an open end). A plain INSERT: the target is empty for what it has not yet filled. Nothing
 * is returned (the rows were counted when the chunks were planned): a RETURNING, even
 * counted, keeps every row written in a tuple store, spilled to disk past work_mem.
 */
export function backfillChunkSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  const keys = tuple(drivingKeyColumns(plan));
  const bound = (param: string) => typedParam(driving, param);
  const written = writtenColumns(plan);
  const inChunk = `($1::text[] IS NULL OR ${keys} > ${bound('$1')})
     AND ($2::text[] IS NULL OR ${keys} <= ${bound('$2')})`;
  // A join with a WHERE fills its key map with every join row of the chunk, in the same
  // statement (one snapshot): see mapReplaced in rederive-sql.ts. A data-modifying CTE runs
  // whether or not the statement reads it.
  const mapped =
    plan.mapKind === 'rows'
      ? `WITH mapped AS (
  INSERT INTO ${plan.mapSql} (${list(plan.sources.flatMap((s) => mapKeys(s)))})
  SELECT ${list(plan.sources.flatMap((s) => s.keyColumns.map((k) => col(s.alias, k))))}
    FROM ${plan.fromSql}
   WHERE ${inChunk}
)
`
      : '';
  return `${mapped}INSERT INTO ${plan.targetSql} (${list(written.map((c) => q(c.name)))})
  SELECT ${selectList(plan)}
    FROM ${plan.fromSql}
   WHERE ${restrictedWhere(inChunk, plan.where)}`;
}

/** How many driving rows lie after `$1` (the last, short, chunk counts its own). */
export function drivingRowsAfterSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  const keys = tuple(driving.keyColumns.map((k) => col('d', k)));
  const typed = tuple(driving.keyTypes.map((type, i) => `(($1::text[])[${i + 1}])::${type}`));
  return `SELECT count(*)::bigint AS n FROM ${driving.table} d WHERE $1::text[] IS NULL OR ${keys} > ${typed}`;
}
