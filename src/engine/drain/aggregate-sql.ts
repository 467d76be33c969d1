import type { ApplyMode } from './apply-choice.js';
import type { PlanSource, TransformPlan } from './plan.js';
import {
  type ChangedSources,
  shadowAffectedGroupsSql,
  shadowFillSql,
  shadowRederiveSql,
  shadowRegroupSql,
} from './shadow-sql.js';
import {
  col,
  keyMatch,
  list,
  own,
  q,
  requireSourceIds,
  restrictedWhere,
  selectList,
  tuple,
  typedKeys,
  upsert,
  writtenColumns,
} from './sql-parts.js';

/**
 * Re-derivation of a GROUP BY transform. A changed source row names the groups it
 * touches: its old groups, read from the key map (every join row that passes WHERE, with
 * every source's key and its group), and its new groups, computed from the sources now.
 * Each of those groups is then recomputed whole, with the definition's own expressions,
 * from the current source state: so any aggregate Postgres has works, and nothing is
 * patched by deltas. The key map is brought up to date in the same statement.
 *
 * Changes are mapped to driving keys (the FROM table's) as for joins: a changed row's old
 * join rows come from the key map, its new ones from the join; the map rows of those
 * driving keys are replaced, and the groups of the old and new rows re-derived.
 *
 * The key map must name every group the target shows a row in, or a row leaving that
 * group would not lead back to it. A recomputed group can show rows whose changes this
 * statement does not drain: it reads the sources as they are when it starts, which can be
 * after its range's last tick (and a range split into pages drains the other pages'
 * keys later). So the map also gains such rows in the groups they are shown in: see
 * `mapJoined`.
 *
 * A grand total (aggregates without GROUP BY) is one row, recomputed on any change.
 */

/** The key map's column for key `n` (1-based) of source `ordinal`. */
export function mapKey(ordinal: number, n: number): string {
  return q(`k${ordinal}_${n}`);
}

/** The key map's column for GROUP BY expression `n` (1-based). */
export function mapGroup(n: number): string {
  return q(`g${n}`);
}

/** A source's key columns in the key map (qualified by `alias` when given). */
export function mapKeys(source: PlanSource, alias?: string): string[] {
  return source.keyColumns.map(
    (_, i) => `${alias ? `${alias}.` : ''}${mapKey(source.ordinal, i + 1)}`,
  );
}

function sourceKeys(source: PlanSource): string[] {
  return source.keyColumns.map((k) => col(source.alias, k));
}

/** The driving keys whose join rows a change can touch (columns k1..kn). */
export function affectedDrivingKeys(plan: TransformPlan, mapSql: string): string {
  const sources = requireSourceIds(plan);
  const driving = sources[0]!;
  const names = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const branches = [
    `SELECT DISTINCT ${list(typedKeys(driving).map((k, i) => `${k} AS ${names[i]}`))}
       FROM changed c WHERE c.source_id = ${driving.sourceId}`,
  ];
  for (const source of sources.slice(1)) {
    const keys = typedKeys(source);
    // Join rows it was part of (the key map), and join rows it is part of now.
    branches.push(`SELECT ${list(mapKeys(driving, 'm'))}
       FROM ${mapSql} m
       JOIN changed c ON c.source_id = ${source.sourceId}
        AND ${mapKeys(source, 'm')
          .map((k, i) => `${k} = ${keys[i]}`)
          .join(' AND ')}`);
    branches.push(`SELECT ${list(sourceKeys(driving))}
       FROM ${plan.fromSql}
      WHERE ${tuple(sourceKeys(source))} IN (
        SELECT ${list(keys)} FROM changed c WHERE c.source_id = ${source.sourceId})`);
  }
  return branches.join('\n     UNION\n     ');
}

/**
 * The key map rows of a GROUP BY transform (columns as in the map), for the driving rows
 * `drivingFilter` selects (all when null). Groups (and a delta transform's aggregate
 * inputs) are computed for passing rows only: an expression may fail on rows WHERE is
 * there to keep out. A join with a LEFT JOIN keeps every join row, and `passes` says
 * whether it passes WHERE: a change to a row WHERE filtered out can still change which
 * rows pass (a LEFT JOIN row that loses its last match turns NULL-extended). Without one,
 * a row WHERE filters out can only start passing through a change the join finds (its new
 * state), so only passing rows are kept (issue #22: a self-join's map held every join row
 * of every nation, where the target read one nation's).
 */
export function mapRows(plan: TransformPlan, drivingFilter: string | null): string {
  const leftJoin = plan.sources.some((s) => s.joinType === 'left');
  const passes = plan.where ? `coalesce((${plan.where}), false)` : 'true';
  const keys = plan.sources.flatMap((s) =>
    sourceKeys(s).map((k, i) => `${k} AS ${mapKey(s.ordinal, i + 1)}`),
  );
  const whenPasses = (expr: string) =>
    leftJoin && plan.where ? `CASE WHEN ${passes} THEN (${expr}) END` : `(${expr})`;
  const groups = plan.groups.map((g, i) => `${whenPasses(g.expression)} AS ${mapGroup(i + 1)}`);
  const inputs = (plan.delta?.inputs ?? []).map(
    (input, i) => `${whenPasses(input.expr)} AS ${q(`i${i + 1}`)}`,
  );
  // Without a LEFT JOIN, passing rows only, WHERE evaluated on the driving rows asked for.
  const where = leftJoin ? null : plan.where;
  const filter = drivingFilter ? restrictedWhere(drivingFilter, where) : where && `(${where})`;
  return `SELECT ${list([...keys, ...groups, `${leftJoin ? passes : 'true'} AS passes`, ...inputs])}
    FROM ${plan.fromSql}${filter ? `\n   WHERE ${filter}` : ''}`;
}

function having(plan: TransformPlan): string {
  return plan.having ? `\n   HAVING (${plan.having})` : '';
}

/**
 * Whether a join row may be newer than the key map knows (see `mapJoined`): one of its
 * tuples was written since `since` (the range's lower tick; its transaction may not be
 * drained yet), or a LEFT JOIN leaves it NULL-extended (a joined row deleted or moved
 * away since leaves no tuple to tell). With no `since` (keys given as a list, when
 * bisecting or repairing a build), or while keys are held (a held key's changes are not
 * drained, however old), any row may be.
 */
function mayBeNewer(plan: TransformPlan, since: string | null): string {
  if (since === null || plan.hasHeldKeys) return 'true';
  // Ages compare xids modulo wraparound; a frozen or special xmin is as old as can be.
  const bound = `(SELECT age(xid(pg_snapshot_xmin(${since}::pg_snapshot))))`;
  return plan.sources
    .flatMap((s) => [
      `age(${q(s.alias)}.xmin) <= ${bound}`,
      ...(s.joinType === 'left' ? [`${col(s.alias, s.keyColumns[0]!)} IS NULL`] : []),
    ])
    .join(' OR ');
}

/** The `aggregated` CTE's columns of the driving keys of rows that may be newer (one per key column). */
function newerColumns(plan: TransformPlan): string[] {
  return plan.sources[0]!.keyColumns.map((_, i) => own(`newer${i + 1}`));
}

/**
 * Every affected group, recomputed from its current rows: groups without a NULL in them
 * are found through `IN` (index-friendly); groups with one (rare) through a null-safe
 * match, a branch that runs only when such a group is affected (a one-time filter). Each
 * group also lists the driving keys of its rows that may be newer than the key map knows,
 * and whether it passes HAVING (`derived` keeps those that do): a group HAVING leaves out
 * of the target still depends on its rows.
 */
function aggregatedGroups(
  plan: TransformPlan,
  since: string | null,
  /** Whether the key map is brought up to date from this scan (see `mapJoined`). */
  listNewer = true,
  /** Every group of the definition, not only those of the `groups` CTE (see recompute). */
  whole = false,
): string {
  const exprs = plan.groups.map((g) => `(${g.expression})`);
  const cols = groupColumns(plan);
  const anyNull = cols.map((c) => `${c} IS NULL`).join(' OR ');
  const groupBy = list(plan.groupBy);
  const driving = plan.sources[0]!;
  const newer = mayBeNewer(plan, since);
  const select = list([
    selectList(plan),
    ...(listNewer
      ? driving.keyColumns.map(
          (k, i) =>
            `array_agg(${col(driving.alias, k)}) FILTER (WHERE ${newer}) AS ${newerColumns(plan)[i]}`,
        )
      : []),
    ...(plan.having ? [`coalesce((${plan.having}), false) AS ${own('kept')}`] : []),
  ]);
  // The group expressions are evaluated inside the EXISTS, where the groups CTE is in
  // scope: its alias and columns are the engine's own names (never a source's).
  const g = own('g');
  if (whole) {
    return `SELECT ${select}
    FROM ${plan.fromSql}${plan.where ? `\n   WHERE (${plan.where})` : ''}
   GROUP BY ${groupBy}`;
  }
  const inNullGroup = `EXISTS (
       SELECT 1 FROM groups ${g}
        WHERE (${cols.map((c) => `${g}.${c} IS NULL`).join(' OR ')})
          AND ${cols.map((c, i) => `${g}.${c} IS NOT DISTINCT FROM ${exprs[i]}`).join(' AND ')})`;
  return `SELECT ${select}
    FROM ${plan.fromSql}
   WHERE ${restrictedWhere(`${tuple(exprs)} IN (SELECT ${list(cols)} FROM groups)`, plan.where)}
   GROUP BY ${groupBy}
  UNION ALL
  SELECT ${select}
    FROM ${plan.fromSql}
   WHERE (SELECT coalesce(bool_or(${anyNull}), false) FROM groups)
     AND ${restrictedWhere(inNullGroup, plan.where)}
   GROUP BY ${groupBy}`;
}

/**
 * Key map rows for rows a recomputed group shows that the map does not name in it.
 *
 * The statement reads the sources as they are when it starts, which can be after its
 * range's last tick, and a range split into pages drains the other pages' keys later: a
 * recomputed group can show a row whose change this statement does not drain. The map
 * still names that row's group before the change; should the row leave the group again
 * before its change is drained, re-deriving it would find only its old group (the map)
 * and its newest (the sources), and the group the target shows it in would never be
 * recomputed: a group that no longer exists, or no longer holds the row, would stay.
 * So the map gains (join row, group) for each such row; the row's map rows are all
 * replaced when it is re-derived itself. Only rows that may be newer than the map are
 * looked for (`mayBeNewer`): a row whose tuples all predate the range was drained with
 * them, and the map names it as it is. Affected driving keys are left out: their map rows
 * are replaced anyway.
 */
function mapJoined(plan: TransformPlan, mapSql: string, whole = false): string {
  const sources = plan.sources;
  const driving = sources[0]!;
  const m = own('m');
  const g = own('g');
  const n = own('n');
  const a = own('a');
  const keyCols = sources.flatMap((s) => mapKeys(s));
  const groupCols = plan.groups.map((_, i) => mapGroup(i + 1));
  const exprs = plan.groups.map((g) => `(${g.expression})`);
  const sameKeys = sources.flatMap((s) =>
    sourceKeys(s).map((k, i) => {
      const mapped = `${m}.${mapKey(s.ordinal, i + 1)}`;
      return s.ordinal === 0 ? `${mapped} = ${k}` : `${mapped} IS NOT DISTINCT FROM ${k}`;
    }),
  );
  const newer = newerColumns(plan);
  const keyNames = driving.keyColumns.map((_, i) => `k${i + 1}`);
  return `INSERT INTO ${mapSql} (${list([...keyCols, ...groupCols, 'passes'])})
  SELECT ${list([...sources.flatMap((s) => sourceKeys(s)), ...exprs, 'true'])}
    FROM ${plan.fromSql}
   WHERE ${restrictedWhere(
     `${tuple(sourceKeys(driving))} IN (
           ${
             whole
               ? `SELECT ${list(keyNames)} FROM newer_rows`
               : `SELECT ${list(keyNames.map((k) => `${n}.${k}`))}
             FROM aggregated ${a} CROSS JOIN LATERAL unnest(${list(newer.map((c) => `${a}.${c}`))}) AS ${n}(${list(keyNames)})`
           }
           EXCEPT SELECT ${list(keyNames)} FROM affected)`,
     plan.where,
   )}
${
  whole
    ? ''
    : `
     AND EXISTS (SELECT 1 FROM groups ${g}
                  WHERE ${groupColumns(plan)
                    .map((c, i) => `${g}.${c} IS NOT DISTINCT FROM ${exprs[i]}`)
                    .join(' AND ')})`
}
     AND NOT EXISTS (SELECT 1 FROM ${mapSql} ${m}
                      WHERE ${[
                        ...sameKeys,
                        `${m}.passes`,
                        ...groupCols.map((c, i) => `${m}.${c} IS NOT DISTINCT FROM ${exprs[i]}`),
                      ].join(' AND ')})`;
}

/** The columns of the `groups` CTE: one per GROUP BY expression, named the engine's way. */
function groupColumns(plan: TransformPlan): string[] {
  return plan.groups.map((_, i) => own(`g${i + 1}`));
}

function grandTotalSql(plan: TransformPlan, changedSql: string): string {
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
derived AS MATERIALIZED (
  SELECT * FROM (
    SELECT ${selectList(plan)}
      FROM ${plan.fromSql}${plan.where ? `\n     WHERE (${plan.where})` : ''}${having(plan)}) total
   WHERE EXISTS (SELECT 1 FROM changed)
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
removed AS (
  DELETE FROM ${plan.targetSql}
   WHERE EXISTS (SELECT 1 FROM changed) AND NOT EXISTS (SELECT 1 FROM derived)
  RETURNING 1
)
SELECT (SELECT count(*) FROM changed)::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed`;
}

/**
 * `since`: the snapshot (SQL) of the tick the changes come after, for a ledger range; null
 * for keys given as a list (see `mayBeNewer`).
 */
export function aggregateRederiveSql(
  plan: TransformPlan,
  changedSql: string,
  since: string | null,
  /**
   * 'recompute': every group of the definition is computed in one pass over the sources
   * and merged into the target (only rows that differ are written, groups that are gone
   * deleted), instead of the changed groups one by one through an index; the key map is
   * still brought up to date for the changed rows only. Cheaper when a change touches a
   * large share of the groups (ADR 0029).
   */
  mode: ApplyMode = 'rederive',
  /** The sources the changes may be of, for a shadow (see ChangedSources); null for all. */
  changed: ChangedSources = null,
): string {
  if (plan.groups.length === 0 || !plan.mapSql) return grandTotalSql(plan, changedSql);
  // A join that fans out keeps its sources' shadow instead (ADR 0051).
  if (plan.mapKind === 'shadow') return shadowRederiveSql(plan, changedSql, mode, changed);
  const mapSql = plan.mapSql;
  const sources = requireSourceIds(plan);
  const driving = sources[0]!;
  const affectedCols = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const groupCols = plan.groups.map((_, i) => mapGroup(i + 1));
  const mapColumns = [...sources.flatMap((s) => mapKeys(s)), ...groupCols, 'passes'];
  const drivingInMap = tuple(mapKeys(driving, 'm'));
  const whole = mode === 'recompute';
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
affected AS MATERIALIZED (
     ${affectedDrivingKeys(plan, mapSql)}
),
old_rows AS MATERIALIZED (
  SELECT ${list(groupCols.map((c) => `m.${c}`))} FROM ${mapSql} m
   WHERE ${drivingInMap} IN (SELECT ${list(affectedCols)} FROM affected) AND m.passes
),
new_rows AS MATERIALIZED (
  ${mapRows(plan, `${tuple(sourceKeys(driving))} IN (SELECT ${list(affectedCols)} FROM affected)`)}
),
map_removed AS (
  DELETE FROM ${mapSql} m WHERE ${drivingInMap} IN (SELECT ${list(affectedCols)} FROM affected)
  RETURNING 1
),
map_added AS (
  INSERT INTO ${mapSql} (${list(mapColumns)}) SELECT ${list(mapColumns)} FROM new_rows
  RETURNING 1
),
groups AS MATERIALIZED (
  ${
    whole
      ? // Every group the target holds: those the definition no longer yields are deleted.
        `SELECT ${list(plan.key.map((k, i) => `t.${q(k)} AS ${groupColumns(plan)[i]}`))} FROM ${plan.targetSql} t`
      : `SELECT ${list(groupCols.map((c, i) => `${c} AS ${groupColumns(plan)[i]}`))} FROM old_rows
  UNION
  SELECT ${list(groupCols)} FROM new_rows WHERE passes`
  }
),
aggregated AS MATERIALIZED (
  ${aggregatedGroups(plan, since, !whole, whole)}
),${
    whole
      ? `
-- A recompute lists the rows that may be newer than the key map in a scan of their own:
-- an array of them per group would make the aggregate's state too big to hash, and the
-- planner would read the whole table through the group index instead.
newer_rows AS MATERIALIZED (
  SELECT ${list(sourceKeys(driving).map((k, i) => `${k} AS k${i + 1}`))}
    FROM ${plan.fromSql}
   WHERE ${plan.where ? `(${plan.where}) AND ` : ''}(${mayBeNewer(plan, since)})
),`
      : ''
  }
derived AS MATERIALIZED (
  SELECT * FROM aggregated${plan.having ? ` WHERE ${own('kept')}` : ''}
),
map_joined AS (
  ${mapJoined(plan, mapSql, whole)}
  RETURNING 1
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
gone AS MATERIALIZED (
  SELECT ${list(groupColumns(plan).map((c, i) => `${c} AS ${q(plan.key[i]!)}`))} FROM groups
  EXCEPT
  SELECT ${list(plan.key.map((k) => `d.${q(k)}`))} FROM derived d
),
removed AS (
  DELETE FROM ${plan.targetSql} t USING gone g
   WHERE ${keyMatch(plan, 't', 'g')}
  RETURNING 1
)
SELECT (SELECT count(*) FROM affected)::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed,
       (SELECT count(*) FROM map_removed)::int AS map_removed,
       (SELECT count(*) FROM map_added)::int AS map_added,
       (SELECT count(*) FROM map_joined)::int AS map_joined`;
}

/**
 * The groups (target keys) a set of changes re-derives, as the drain routes them: their
 * old groups from the key map and their new groups from the sources. A statement over the
 * `changed` CTE (`changedSql` is its body), selecting each group's key columns as text
 * (`ARRAY[...]::text[]`, column `k`), narrowed by `filter` (a condition on `groups`, or
 * null). For a grand total, one empty key when anything changed. The self-check asks it to
 * tell a difference the drain has yet to apply from one it never will.
 */
export function affectedGroupsSql(
  plan: TransformPlan,
  changedSql: string,
  filter: (groupColumns: string[]) => string | null,
): string {
  if (plan.groups.length === 0 || !plan.mapSql) {
    return `WITH changed AS MATERIALIZED (
  ${changedSql}
)
SELECT '{}'::text[] AS k WHERE EXISTS (SELECT 1 FROM changed)`;
  }
  if (plan.mapKind === 'shadow') return shadowAffectedGroupsSql(plan, changedSql, filter);
  const mapSql = plan.mapSql;
  const driving = requireSourceIds(plan)[0]!;
  const affectedCols = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const groupCols = plan.groups.map((_, i) => mapGroup(i + 1));
  const drivingInMap = tuple(mapKeys(driving, 'm'));
  const named = groupColumns(plan);
  const where = filter(named);
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
affected AS MATERIALIZED (
     ${affectedDrivingKeys(plan, mapSql)}
),
groups AS MATERIALIZED (
  SELECT ${list(groupCols.map((c, i) => `m.${c} AS ${named[i]}`))} FROM ${mapSql} m
   WHERE ${drivingInMap} IN (SELECT ${list(affectedCols)} FROM affected) AND m.passes
  UNION
  SELECT ${list(groupCols.map((c, i) => `n.${c} AS ${named[i]}`))}
    FROM (${mapRows(plan, `${tuple(sourceKeys(driving))} IN (SELECT ${list(affectedCols)} FROM affected)`)}) n
   WHERE n.passes
)
SELECT DISTINCT ARRAY[${list(named.map((c) => `${c}::text COLLATE "C"`))}]::text[] AS k
  FROM groups${
    where
      ? `
 WHERE ${where}`
      : ''
  }`;
}

/**
 * Re-derives the groups given as `$1` (a JSON array of text arrays, one per group key, in
 * key order) whole, from the sources now: upserts what they are, deletes those the
 * definition no longer produces. The drain's path for a group (derivedGroups, upsert,
 * delete), with the groups named instead of found through changes: what a self-check's
 * repair runs after re-deriving the groups' rows, for a group the target holds and no row
 * maps to.
 */
export function regroupSql(plan: TransformPlan): string {
  if (plan.mapKind === 'shadow') return shadowRegroupSql(plan);
  const named = groupColumns(plan);
  const typed = plan.groups.map((g, i) => `(e->>${i})::${g.type} AS ${named[i]}`);
  return `WITH groups AS MATERIALIZED (
  SELECT ${list(typed)} FROM jsonb_array_elements($1::jsonb) e
),
aggregated AS MATERIALIZED (
  ${aggregatedGroups(plan, null, false)}
),
derived AS MATERIALIZED (
  SELECT * FROM aggregated${plan.having ? ` WHERE ${own('kept')}` : ''}
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
gone AS MATERIALIZED (
  SELECT ${list(named.map((c, i) => `${c} AS ${q(plan.key[i]!)}`))} FROM groups
  EXCEPT
  SELECT ${list(plan.key.map((k) => `d.${q(k)}`))} FROM derived d
),
removed AS (
  DELETE FROM ${plan.targetSql} t USING gone g
   WHERE ${keyMatch(plan, 't', 'g')}
  RETURNING 1
)
SELECT (SELECT count(*) FROM upserted)::int AS upserted, (SELECT count(*) FROM removed)::int AS removed`;
}

/**
 * Backfill of a GROUP BY transform (stage 'groups'): every group at once, as one aggregate
 * query, and the key map filled in the same statement. One statement, one snapshot: the
 * map must name every group the target holds, as it was when the target was computed. (A
 * map filled in earlier chunks would name the groups of older states: a group the target
 * got from a later state, and that changed again, would never be re-derived away.) The
 * target is filled by a data-modifying CTE (run whether or not it is read) and the key map
 * by the statement itself, whose row count is the join rows mapped: nothing is returned,
 * so no row is kept in a tuple store (ADR 0050).
 */
export function groupsFillSql(plan: TransformPlan): string {
  const written = writtenColumns(plan);
  const fill = `INSERT INTO ${plan.targetSql} (${list(written.map((c) => q(c.name)))})
  SELECT ${selectList(plan)}
    FROM ${plan.fromSql}${plan.where ? `\n   WHERE (${plan.where})` : ''}${
      plan.groupBy.length ? `\n   GROUP BY ${list(plan.groupBy)}` : ''
    }${having(plan)}`;
  if (!plan.mapSql) return fill;
  // A shadow's statement returns the rows it mapped (`rows`): see fillGroups.
  if (plan.mapKind === 'shadow') return shadowFillSql(plan, fill);
  const mapColumns = [
    ...plan.sources.flatMap((s) => mapKeys(s)),
    ...plan.groups.map((_, i) => mapGroup(i + 1)),
    'passes',
  ];
  return `WITH filled AS (
  ${fill}
)
INSERT INTO ${plan.mapSql} (${list(mapColumns)})
  ${mapRows(plan, null)}`;
}
