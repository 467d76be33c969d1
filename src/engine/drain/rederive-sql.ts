import { aggregateRederiveSql, mapKeys } from './aggregate-sql.js';
import type { ApplyMode } from './apply-choice.js';
import { changedFromList } from './changed-sql.js';
import { deltaApplySql, deltaRecomputeSql } from './delta-sql.js';
import type { TransformPlan } from './plan.js';
import type { ChangedSources } from './shadow-sql.js';
import {
  col,
  keyMatch,
  list,
  q,
  requireSourceIds,
  restrictedWhere,
  selectList,
  tuple,
  typedKeys,
  upsert,
} from './sql-parts.js';

/**
 * SQL that re-derives a transform's target rows for a set of changed source keys, from
 * the sources' current state. Never a delta: re-deriving a key twice, or in any order,
 * gives the same target (I3), which is what makes retries, takeovers and overlapping
 * pages safe.
 *
 * Every statement starts from a CTE `changed(source_id, key)`: the changed keys, as the
 * ledger stores them (text[]). Where they come from is the caller's choice (a ledger
 * range, or an explicit list when bisecting a failing page).
 *
 * Projections, filters and joins re-derive by driving key (the FROM table's key): every
 * target row holds its driving row's key, so a change anywhere maps to the driving keys
 * of the target rows holding the changed row's key (the old state, read from the target
 * itself) and of the join rows holding it now (the new state, through the join).
 */

/**
 * The driving keys (of the FROM table) whose target rows a change can touch: a query over
 * the `changed` CTE, with columns k1..kn (typed). The self-check asks it too, to tell a
 * difference the drain has yet to apply from one it never will (selfcheck/classify-sql.ts).
 */
export function affectedDrivingKeys(plan: TransformPlan): string {
  const sources = requireSourceIds(plan);
  const driving = sources[0]!;
  const drivingTargetKeys = driving.targetKeyColumns!;
  const names = drivingTargetKeys.map((_, i) => `k${i + 1}`);
  const branches: string[] = [
    `SELECT DISTINCT ${list(typedKeys(driving).map((k, i) => `${k} AS ${names[i]}`))}
       FROM changed c WHERE c.source_id = ${driving.sourceId}`,
  ];
  for (const source of sources.slice(1)) {
    const keys = typedKeys(source);
    if (plan.mapKind === 'rows') {
      // The old state: join rows it was part of, as the key map holds them (WHERE or not).
      branches.push(`SELECT ${list(mapKeys(driving, 'm'))}
       FROM ${plan.mapSql} m
       JOIN changed c ON c.source_id = ${source.sourceId}
        AND ${mapKeys(source, 'm')
          .map((k, i) => `${k} = ${keys[i]}`)
          .join(' AND ')}`);
    } else {
      // The old state: target rows that hold the changed row's key (without a WHERE, the
      // target holds every join row).
      const held = source.targetKeyColumns!;
      branches.push(`SELECT ${list(drivingTargetKeys.map((k) => `t.${q(k)}`))}
       FROM ${plan.targetSql} t
       JOIN changed c ON c.source_id = ${source.sourceId}
        AND ${held.map((k, i) => `t.${q(k)} = ${keys[i]}`).join(' AND ')}`);
    }
    // The new state: join rows that hold it now (join conditions only, no WHERE: a row
    // that stopped qualifying must still find its driving row).
    branches.push(`SELECT ${list(driving.keyColumns.map((k) => col(driving.alias, k)))}
       FROM ${plan.fromSql}
      WHERE ${tuple(source.keyColumns.map((k) => col(source.alias, k)))} IN (
        SELECT ${list(keys)} FROM changed c WHERE c.source_id = ${source.sourceId})`);
  }
  return branches.join('\n     UNION\n     ');
}

/**
 * The driving keys (as text[], as the ledger holds keys) that the changed keys given as
 * `$1` (see changedFromList) touch: where a joined row's failure is attributed.
 */
export function affectedDrivingKeysSql(plan: TransformPlan): string {
  const n = plan.sources[0]!.keyColumns.length;
  const cols = Array.from({ length: n }, (_, i) => `k${i + 1}::text`);
  return `WITH changed AS MATERIALIZED (
  ${changedFromList()}
),
affected AS (
     ${affectedDrivingKeys(plan)}
)
SELECT DISTINCT ARRAY[${list(cols)}] AS k FROM affected`;
}

/**
 * Target rows of the affected driving keys that the derivation no longer produces. For a
 * single table the target key is the driving key: the affected keys not derived. For a
 * join, the target rows those keys hold now, less the derived ones.
 */
function gone(plan: TransformPlan): string {
  const drivingTargetKeys = plan.sources[0]!.targetKeyColumns!;
  const affectedCols = drivingTargetKeys.map((_, i) => `k${i + 1}`);
  if (plan.sources.length === 1) {
    return `SELECT ${list(affectedCols.map((k, i) => `${k} AS ${q(drivingTargetKeys[i]!)}`))} FROM affected
  EXCEPT
  SELECT ${list(drivingTargetKeys.map((k) => `d.${q(k)}`))} FROM derived d`;
  }
  return `SELECT ${list(plan.key.map((k) => `t.${q(k)}`))} FROM ${plan.targetSql} t
   WHERE ${tuple(drivingTargetKeys.map((k) => `t.${q(k)}`))} IN (SELECT ${list(affectedCols)} FROM affected)
  EXCEPT
  SELECT ${list(plan.key.map((k) => `d.${q(k)}`))} FROM derived d`;
}

/**
 * One statement that re-derives the target rows for `changed`: upserts what qualifies
 * now, deletes what no longer does, and reports how many keys, upserts and deletes.
 * `changedSql` is the body of the `changed(source_id, key)` CTE; `since`, for changes
 * from a ledger range, the snapshot (SQL) of the tick it starts after (null for a list of
 * keys: a GROUP BY then treats every row it reads as possibly newer than its key map).
 *
 * Row estimates for the ledger and these CTEs are often far off (the ledger is young and
 * unanalysed), so nothing here may depend on them: rows to delete are found with EXCEPT
 * (hashed or sorted, never a nested loop over a CTE), and every join the planner could
 * turn into a nested loop has an index on its inner side.
 */
export function rederiveSql(
  plan: TransformPlan,
  changedSql: string,
  since: string | null = null,
  /** 'recompute' (a GROUP BY only): every group recomputed and merged; see aggregateRederiveSql. */
  mode: ApplyMode = 'rederive',
  /**
   * The sources the changes may be of (a superset), or null for all: a shadow's statement
   * then plans joins only for those (see ChangedSources in shadow-sql.ts).
   */
  changed: ChangedSources = null,
): string {
  if (plan.delta) {
    return mode === 'recompute'
      ? deltaRecomputeSql(plan, changedSql)
      : deltaApplySql(plan, changedSql, changed);
  }
  if (plan.aggregates) return aggregateRederiveSql(plan, changedSql, since, mode, changed);
  const driving = plan.sources[0]!;
  const drivingKeys = tuple(driving.keyColumns.map((k) => col(driving.alias, k)));
  const drivingTargetKeys = driving.targetKeyColumns!;
  const affectedCols = drivingTargetKeys.map((_, i) => `k${i + 1}`);
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
affected AS MATERIALIZED (
     ${affectedDrivingKeys(plan)}
),${plan.mapKind === 'rows' ? mapReplaced(plan) : ''}
derived AS MATERIALIZED (
  SELECT ${selectList(plan)}
    FROM ${plan.fromSql}
   WHERE ${restrictedWhere(`${drivingKeys} IN (SELECT ${list(affectedCols)} FROM affected)`, plan.where)}
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
gone AS MATERIALIZED (
  ${gone(plan)}
),
removed AS (
  DELETE FROM ${plan.targetSql} t USING gone g
   WHERE ${keyMatch(plan, 't', 'g')}
  RETURNING 1
)
SELECT (SELECT count(*) FROM affected)::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed${
         plan.mapKind === 'rows'
           ? `,
       (SELECT count(*) FROM map_removed)::int AS map_removed,
       (SELECT count(*) FROM map_added)::int AS map_added`
           : ''
       }`;
}

/**
 * The key map of a join with a WHERE, brought up to date for the affected driving keys:
 * their join rows as they are now, before WHERE (CTEs `map_removed`, `map_added`).
 */
function mapReplaced(plan: TransformPlan): string {
  const sources = plan.sources;
  const driving = sources[0]!;
  const affectedCols = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const mapColumns = sources.flatMap((s) => mapKeys(s));
  return `
map_removed AS (
  DELETE FROM ${plan.mapSql} m
   WHERE ${tuple(mapKeys(driving, 'm'))} IN (SELECT ${list(affectedCols)} FROM affected)
  RETURNING 1
),
map_added AS (
  INSERT INTO ${plan.mapSql} (${list(mapColumns)})
  SELECT ${list(sources.flatMap((s) => s.keyColumns.map((k) => col(s.alias, k))))}
    FROM ${plan.fromSql}
   WHERE ${tuple(driving.keyColumns.map((k) => col(driving.alias, k)))} IN (SELECT ${list(affectedCols)} FROM affected)
  RETURNING 1
),`;
}
