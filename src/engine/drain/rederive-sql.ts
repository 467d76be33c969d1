import { quoteIdent } from '../identifiers.js';
import type { PlanColumn, PlanSource, TransformPlan } from './plan.js';

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

const q = quoteIdent;

function col(alias: string, name: string): string {
  return `${q(alias)}.${q(name)}`;
}

function list(items: string[]): string {
  return items.join(', ');
}

/** The changed keys of `source`, cast back from text to the key columns' types. */
function typedKeys(source: PlanSource, from = 'c'): string[] {
  return source.keyTypes.map((type, i) => `(${from}.key[${i + 1}])::${type}`);
}

function tuple(items: string[]): string {
  return items.length === 1 ? items[0]! : `(${list(items)})`;
}

/** Columns written by the drain: every column but the paused ones (left as they are). */
export function writtenColumns(plan: TransformPlan): PlanColumn[] {
  return plan.columns.filter((c) => !c.paused || c.isKey);
}

function requireSourceIds(plan: TransformPlan): Array<PlanSource & { sourceId: number }> {
  return plan.sources.map((s) => {
    if (s.sourceId === null) {
      throw new Error(`capture of ${s.alias} is not installed yet for transform ${plan.target}`);
    }
    return s as PlanSource & { sourceId: number };
  });
}

/** The driving keys (of the FROM table) whose target rows a change can touch. */
function affectedDrivingKeys(plan: TransformPlan): string {
  const sources = requireSourceIds(plan);
  const driving = sources[0]!;
  const drivingTargetKeys = driving.targetKeyColumns!;
  const names = drivingTargetKeys.map((_, i) => `k${i + 1}`);
  const branches: string[] = [
    `SELECT DISTINCT ${list(typedKeys(driving).map((k, i) => `${k} AS ${names[i]}`))}
       FROM changed c WHERE c.source_id = ${driving.sourceId}`,
  ];
  for (const source of sources.slice(1)) {
    const held = source.targetKeyColumns!;
    const keys = typedKeys(source);
    // The old state: target rows that hold the changed row's key.
    branches.push(`SELECT ${list(drivingTargetKeys.map((k) => `t.${q(k)}`))}
       FROM ${plan.targetSql} t
       JOIN changed c ON c.source_id = ${source.sourceId}
        AND ${held.map((k, i) => `t.${q(k)} = ${keys[i]}`).join(' AND ')}`);
    // The new state: join rows that hold it now (join conditions only, no WHERE: a row
    // that stopped qualifying must still find its driving row).
    branches.push(`SELECT ${list(driving.keyColumns.map((k) => col(driving.alias, k)))}
       FROM ${plan.fromSql}
      WHERE ${tuple(source.keyColumns.map((k) => col(source.alias, k)))} IN (
        SELECT ${list(keys)} FROM changed c WHERE c.source_id = ${source.sourceId})`);
  }
  return branches.join('\n     UNION\n     ');
}

function changedValues(values: PlanColumn[], left: string, right: string): string {
  return values
    .map((c) =>
      c.comparable
        ? `${left}.${q(c.name)} IS DISTINCT FROM ${right}.${q(c.name)}`
        : `${left}.${q(c.name)}::text IS DISTINCT FROM ${right}.${q(c.name)}::text`,
    )
    .join(' OR ');
}

/**
 * Writes the rows of `from` into the target: new keys inserted, existing ones updated.
 * Rows that come out the same are not rewritten: no churn, and nothing for a chained
 * transform's capture to pick up. (MERGE costs less per row, but cannot sit in a WITH
 * before Postgres 17.)
 */
function upsert(plan: TransformPlan, from: string): string {
  const written = writtenColumns(plan);
  const keySet = new Set(plan.key);
  const values = written.filter((c) => !keySet.has(c.name));
  const columnList = list(written.map((c) => q(c.name)));
  const excluded = list(values.map((c) => `${q(c.name)} = EXCLUDED.${q(c.name)}`));
  let conflict: string;
  if (plan.key.length === 0) {
    conflict = `ON CONFLICT ((true)) DO UPDATE SET ${excluded}`;
  } else if (values.length === 0) {
    conflict = `ON CONFLICT (${list(plan.key.map(q))}) DO NOTHING`;
  } else {
    conflict = `ON CONFLICT (${list(plan.key.map(q))}) DO UPDATE SET ${excluded}`;
  }
  const unchanged =
    values.length && plan.key.length > 0
      ? `\n      WHERE ${changedValues(values, 't', 'EXCLUDED')}`
      : '';
  return `INSERT INTO ${plan.targetSql} AS t (${columnList})
      SELECT ${columnList} FROM ${from}
      ${conflict}${unchanged}`;
}

function keyMatch(plan: TransformPlan, left: string, right: string): string {
  return plan.key
    .map((k) => {
      const nullable = !plan.columns.find((c) => c.name === k)?.notNull;
      return nullable
        ? `${left}.${q(k)} IS NOT DISTINCT FROM ${right}.${q(k)}`
        : `${left}.${q(k)} = ${right}.${q(k)}`;
    })
    .join(' AND ');
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

function selectList(plan: TransformPlan): string {
  return list(writtenColumns(plan).map((c) => `${c.expression} AS ${q(c.name)}`));
}

/**
 * One statement that re-derives the target rows for `changed`: upserts what qualifies
 * now, deletes what no longer does, and reports how many keys, upserts and deletes.
 * `changedSql` is the body of the `changed(source_id, key)` CTE.
 *
 * Row estimates for the ledger and these CTEs are often far off (the ledger is young and
 * unanalysed), so nothing here may depend on them: rows to delete are found with EXCEPT
 * (hashed or sorted, never a nested loop over a CTE), and every join the planner could
 * turn into a nested loop has an index on its inner side.
 */
export function rederiveSql(plan: TransformPlan, changedSql: string): string {
  if (plan.aggregates) throw new Error('aggregate transforms are re-derived by group');
  const driving = plan.sources[0]!;
  const drivingKeys = tuple(driving.keyColumns.map((k) => col(driving.alias, k)));
  const drivingTargetKeys = driving.targetKeyColumns!;
  const affectedCols = drivingTargetKeys.map((_, i) => `k${i + 1}`);
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
affected AS MATERIALIZED (
     ${affectedDrivingKeys(plan)}
),
derived AS MATERIALIZED (
  SELECT ${selectList(plan)}
    FROM ${plan.fromSql}
   WHERE ${plan.where ? `(${plan.where}) AND ` : ''}${drivingKeys} IN (SELECT ${list(affectedCols)} FROM affected)
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
       (SELECT count(*) FROM removed)::int AS removed`;
}

/**
 * The changed keys of one ledger range (after tick `$1`'s snapshot, up to tick `$2`'s),
 * for this transform's sources, less the keys held back from it (a key changed twice
 * appears twice; consumers dedupe on typed keys, far cheaper than on text[]). A page narrows it to a
 * block range (`$3`..`$4`, end exclusive, as tids) of one ledger generation, read by TID
 * range alone: the fence (OFFSET 0) keeps the planner from preferring the xid index,
 * whose estimates for a young ledger are far off, and scanning the whole range per page.
 * With `buckets`, it keeps the keys whose hash falls in bucket `$5` (`$3` unpaged).
 */
export function changedFromLedger(
  schema: string,
  plan: TransformPlan,
  generation: number | null,
  buckets = 1,
): string {
  const s = q(schema);
  const ids = requireSourceIds(plan).map((src) => src.sourceId);
  const from =
    generation === null
      ? `${s}.ledger l`
      : `(SELECT * FROM ${s}.${q(`ledger_${generation}`)} WHERE ctid >= $3::tid AND ctid < $4::tid OFFSET 0) l`;
  const bucketParam = generation === null ? '$3' : '$5';
  const bucket =
    buckets > 1
      ? `\n     AND (hashtext(l.key::text) & 2147483647) % ${buckets} = ${bucketParam}::int`
      : '';
  const held = plan.hasHeldKeys
    ? `
     AND NOT EXISTS (SELECT 1 FROM ${s}.held_keys h
                      WHERE h.transform_id = ${plan.id} AND h.source_id = l.source_id AND h.key = l.key)`
    : '';
  return `SELECT l.source_id, l.key
    FROM ${from}
   WHERE l.source_id IN (${[...new Set(ids)].join(', ')})
     AND l.xid >= pg_snapshot_xmin($1::pg_snapshot) AND l.xid < pg_snapshot_xmax($2::pg_snapshot)
     AND pg_visible_in_snapshot(l.xid, $2::pg_snapshot)
     AND NOT pg_visible_in_snapshot(l.xid, $1::pg_snapshot)
     AND l.key IS NOT NULL${held}${bucket}`;
}

/** Changed keys given explicitly as `$1`: a JSON array of `{"s": source_id, "k": [text, ...]}`. */
export function changedFromList(): string {
  return `SELECT (e->>'s')::int AS source_id, ARRAY(SELECT jsonb_array_elements_text(e->'k')) AS key
    FROM jsonb_array_elements($1::jsonb) e`;
}

function drivingKeyColumns(plan: TransformPlan): string[] {
  const driving = plan.sources[0]!;
  return driving.keyColumns.map((k) => col(driving.alias, k));
}

/**
 * The key that ends a backfill chunk of `$2` driving rows after key `$1` (a text[], or
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
 * an open end). A plain INSERT: the target is empty for what it has not yet filled.
 */
export function backfillChunkSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  const keys = tuple(drivingKeyColumns(plan));
  const bound = (param: string) =>
    tuple(driving.keyTypes.map((type, i) => `((${param}::text[])[${i + 1}])::${type}`));
  const written = writtenColumns(plan);
  return `WITH filled AS (
  INSERT INTO ${plan.targetSql} (${list(written.map((c) => q(c.name)))})
  SELECT ${selectList(plan)}
    FROM ${plan.fromSql}
   WHERE ${plan.where ? `(${plan.where}) AND ` : ''}($1::text[] IS NULL OR ${keys} > ${bound('$1')})
     AND ($2::text[] IS NULL OR ${keys} <= ${bound('$2')})
  RETURNING 1
)
SELECT count(*)::int AS rows FROM filled`;
}

/** How many driving rows lie after `$1` (the last, short, chunk counts its own). */
export function drivingRowsAfterSql(plan: TransformPlan): string {
  const driving = plan.sources[0]!;
  const keys = tuple(driving.keyColumns.map((k) => col('d', k)));
  const typed = tuple(driving.keyTypes.map((type, i) => `(($1::text[])[${i + 1}])::${type}`));
  return `SELECT count(*)::bigint AS n FROM ${driving.table} d WHERE $1::text[] IS NULL OR ${keys} > ${typed}`;
}
