import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { TransformPlan } from './plan.js';

/**
 * Statistics for a freshly built target, key map and group states: until autovacuum gets
 * to them, the planner would take them for the empty tables they were, and re-derive
 * groups by reading whole source tables. (A role that does not own them gets a warning,
 * not an error, and autovacuum does it later.)
 *
 * When this step built their indexes (`indexed`: deferred at the start of the build), each
 * index build has already set its table's row and page counts (pg_class.reltuples,
 * relpages), which is what the planner and the apply choice (apply-choice.ts) size tables
 * by; a lookup through a unique index is estimated at one row without any statistics. So
 * only the columns of indexes that are not unique are analysed (the key map's source keys,
 * a join target's joined keys, an index of the user's): without their statistics the
 * planner takes a value for 0.5% of the table and may scan the whole key map for a few
 * changed keys. The rest is left to autovacuum, which analyses the tables in full soon
 * after (an ANALYZE of some columns does not reset the count of rows changed since the
 * last one). ANALYZE samples up to 30,000 rows, and was 5–10% of a build (ADR 0050).
 * Otherwise (the target kept its key because another transform reads it, or a repair put
 * the indexes back earlier) the tables are analysed in full: their counts may be stale.
 */
export async function analyzeBuilt(
  session: Session,
  plan: TransformPlan,
  indexed: boolean,
): Promise<void> {
  const tables = [
    plan.targetSql,
    ...(plan.mapSql ? [plan.mapSql] : []),
    ...(plan.delta ? [plan.delta.statesSql] : []),
  ];
  if (!indexed) {
    for (const table of tables) await session.query(`ANALYZE ${table}`);
    return;
  }
  await analyzeIndexedColumns(session, tables);
}

/**
 * ANALYZEs the columns of each table's non-unique indexes (the whole table for an
 * expression index). A table with no such index is skipped, or with `everyTable` analysed
 * whole (its row count is otherwise unknown).
 */
async function analyzeIndexedColumns(
  session: Session,
  tables: string[],
  everyTable = false,
): Promise<void> {
  // Per table: the columns of its indexes that are not unique (NULL for an expression index
  // or no such index: the whole table then).
  const looked = await session.query<{ table: string; columns: string[] | null }>(
    `SELECT t.tbl AS table,
            CASE WHEN count(i.indexrelid) = 0 OR bool_or(0 = ANY (i.indkey::int2[])) THEN NULL
                 ELSE array_agg(DISTINCT a.attname::text) END AS columns
       FROM unnest($1::text[]) AS t(tbl)
       LEFT JOIN pg_index i ON i.indrelid = t.tbl::regclass AND NOT i.indisunique
       LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum > 0 AND NOT a.attisdropped
        AND (a.attnum = ANY (i.indkey::int2[])
             -- A partial index's predicate column (a shadow's occurrence \`o\`, ADR 0051):
             -- without its statistics each occurrence is taken for 0.5% of the table
             -- (words of the predicate: a name it merely contains is analysed too).
             OR (i.indpred IS NOT NULL
                 AND a.attname::text = ANY (regexp_split_to_array(pg_get_expr(i.indpred, i.indrelid), '\\W+'))))
      GROUP BY t.tbl
     HAVING $2 OR count(i.indexrelid) > 0`,
    [tables, everyTable],
  );
  for (const { table, columns } of looked) {
    const only = columns ? ` (${columns.map((c) => quoteIdent(c)).join(', ')})` : '';
    await session.query(`ANALYZE ${table}${only}`);
  }
}

/**
 * Statistics for the key map and group states a recompute has just filled again (after a
 * TRUNCATE, which leaves a table with no row count: pg_class.reltuples -1). Without them
 * the next range's apply choice (apply-choice.ts) could not size the groups and would
 * apply a burst by delta however big, and the planner would take the tables for empty.
 * The target was merged in place and keeps its own. As after a build, only the columns of
 * non-unique indexes are analysed (which sets the row count too); the states, whose only
 * index is unique, are analysed whole (one row per group, at most 30,000 sampled).
 */
export async function analyzeRefilled(session: Session, plan: TransformPlan): Promise<void> {
  await analyzeIndexedColumns(
    session,
    [...(plan.mapSql ? [plan.mapSql] : []), ...(plan.delta ? [plan.delta.statesSql] : [])],
    true,
  );
}
