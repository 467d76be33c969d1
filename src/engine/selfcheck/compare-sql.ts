import { affectedGroupsSql } from '../drain/aggregate-sql.js';
import { chunkEndSql } from '../drain/backfill-sql.js';
import { inRange } from '../drain/changed-sql.js';
import { affectedDrivingKeys } from '../drain/rederive-sql.js';
import {
  col,
  list,
  own,
  q,
  requireSourceIds,
  restrictedWhere,
  tuple,
  typedParam,
} from '../drain/sql-parts.js';
import { quoteIdent } from '../identifiers.js';
import type { CheckShape } from './shape.js';

/**
 * SQL of a self-check (ADR 0015). Both sides of a comparison are read as text, byte for
 * byte (`COLLATE "C"`): a value image that differs is a difference, as it is for the
 * drain (1.0 is not 1.00, 'a' is not 'A' under a case-blind collation). Each side's rows
 * become (key, values) pairs of text arrays, and `EXCEPT ALL` both ways leaves what
 * differs; only that leaves Postgres.
 */

/** Which part of the key space a comparison covers, on the target (`t`) and the definition. */
export interface Scope {
  target: string;
  definition: string;
}

function asText(items: string[]): string {
  return items.length === 0
    ? "'{}'::text[]"
    : `ARRAY[${list(items.map((i) => `(${i})::text COLLATE "C"`))}]::text[]`;
}

function targetKeyColumns(shape: CheckShape, alias: string): string[] {
  return shape.key.map((k) => `${alias}.${q(k.name)}`);
}

function groupExpressions(shape: CheckShape): string[] {
  return shape.plan.groups.map((g) => `(${g.expression})`);
}

/** `$param` (a text[]) cast to the types of `types`, as a row. */
function typedArray(types: string[], param: string): string {
  return tuple(types.map((type, i) => `((${param}::text[])[${i + 1}])::${type}`));
}

/** The elements of a JSON array element `e` (a key as a text array), typed. */
function typedElement(types: string[]): string[] {
  return types.map((type, i) => `(e->>${i})::${type}`);
}

function notNull(items: string[]): string {
  return items.map((i) => `${i} IS NOT NULL`).join(' AND ') || 'true';
}

function anyNull(items: string[]): string {
  return items.map((i) => `${i} IS NULL`).join(' OR ') || 'false';
}

function range(items: string[], types: string[]): string {
  const row = tuple(items);
  return `($1::text[] IS NULL OR ${row} > ${typedArray(types, '$1')})
     AND ($2::text[] IS NULL OR ${row} <= ${typedArray(types, '$2')})`;
}

/** Keys in the ranges `($1, $2]` (text[] bounds, NULL for an open end). */
export function rangeScope(shape: CheckShape): Scope {
  if (shape.kind === 'driving') {
    const d = shape.driving;
    return {
      target: typedRange(
        d.targetKeyColumns!.map((c) => `t.${q(c)}`),
        d,
      ),
      definition: typedRange(
        d.keyColumns.map((k) => col(d.alias, k)),
        d,
      ),
    };
  }
  const types = shape.key.map((k) => k.type);
  const t = targetKeyColumns(shape, 't');
  const g = groupExpressions(shape);
  return {
    target: `${notNull(t)} AND ${range(t, types)}`,
    definition: `${notNull(g)} AND ${range(g, types)}`,
  };
}

function typedRange(items: string[], driving: CheckShape['driving']): string {
  const row = tuple(items);
  return `($1::text[] IS NULL OR ${row} > ${typedParam(driving, '$1')})
     AND ($2::text[] IS NULL OR ${row} <= ${typedParam(driving, '$2')})`;
}

/** Groups with a NULL in their key (compared apart from the ranges). */
export function nullGroupsScope(shape: CheckShape): Scope {
  return {
    target: anyNull(targetKeyColumns(shape, 't')),
    definition: anyNull(groupExpressions(shape)),
  };
}

/** Everything (a grand total). */
export const WHOLE: Scope = { target: 'true', definition: 'true' };

/**
 * The keys listed in `$1` (a JSON array of keys, each a text array): driving keys for a
 * `driving` shape; for `groups`, keys without a NULL in `$1` and keys with one in `$2`.
 */
export function keyListScope(shape: CheckShape): Scope {
  if (shape.kind === 'driving') {
    const d = shape.driving;
    const listed = `(SELECT ${list(typedElement(d.keyTypes))} FROM jsonb_array_elements($1::jsonb) e)`;
    return {
      target: `${tuple(d.targetKeyColumns!.map((c) => `t.${q(c)}`))} IN ${listed}`,
      definition: `${tuple(d.keyColumns.map((k) => col(d.alias, k)))} IN ${listed}`,
    };
  }
  if (shape.kind === 'total') return WHOLE;
  const types = shape.key.map((k) => k.type);
  const listed = (items: string[]) => {
    const typed = typedElement(types);
    return `(${tuple(items)} IN (SELECT ${list(typed)} FROM jsonb_array_elements($1::jsonb) e)
        OR EXISTS (SELECT 1 FROM jsonb_array_elements($2::jsonb) e
                    WHERE ${items.map((item, i) => `${item} IS NOT DISTINCT FROM ${typed[i]}`).join(' AND ')}))`;
  };
  return {
    target: listed(targetKeyColumns(shape, 't')),
    definition: listed(groupExpressions(shape)),
  };
}

/**
 * Leaves out the keys listed in `$<param>` (a JSON array of text arrays: driving keys for
 * a `driving` shape, group keys otherwise): the rows keys held in quarantine route to.
 */
export function excludedScope(shape: CheckShape, param: number): Scope {
  const p = `$${param}::jsonb`;
  if (shape.kind === 'total') {
    return { target: `jsonb_array_length(${p}) = 0`, definition: `jsonb_array_length(${p}) = 0` };
  }
  const types = shape.kind === 'driving' ? shape.driving.keyTypes : shape.key.map((k) => k.type);
  const typed = typedElement(types);
  const none = (items: string[]) =>
    `NOT EXISTS (SELECT 1 FROM jsonb_array_elements(${p}) e
                  WHERE ${items.map((item, i) => `${item} IS NOT DISTINCT FROM ${typed[i]}`).join(' AND ')})`;
  if (shape.kind === 'driving') {
    const d = shape.driving;
    return {
      target: none(d.targetKeyColumns!.map((c) => `t.${q(c)}`)),
      definition: none(d.keyColumns.map((k) => col(d.alias, k))),
    };
  }
  return { target: none(targetKeyColumns(shape, 't')), definition: none(groupExpressions(shape)) };
}

/** Both scopes at once. */
export function both(a: Scope, b: Scope): Scope {
  return {
    target: `(${a.target}) AND (${b.target})`,
    definition: `(${a.definition}) AND (${b.definition})`,
  };
}

/** The definition, recomputed from the sources, for the keys `scope` covers. */
function definitionSql(shape: CheckShape, scope: string): string {
  const plan = shape.plan;
  const keyNames = new Set(plan.key);
  const columns = plan.columns.filter((c) => keyNames.has(c.name) || !c.paused);
  // The WHERE is evaluated on the scope's rows only (restrictedWhere): a row outside the
  // chunk that fails it (held in quarantine) must not fail the chunk's comparison.
  const filter =
    scope === 'true' ? plan.where && `(${plan.where})` : restrictedWhere(scope, plan.where);
  return `SELECT ${list(columns.map((c) => `${c.expression} AS ${q(c.name)}`))}
    FROM ${plan.fromSql}${filter ? `\n   WHERE ${filter}` : ''}${
      plan.aggregates && plan.groupBy.length ? `\n   GROUP BY ${list(plan.groupBy)}` : ''
    }${plan.having ? `\n   HAVING (${plan.having})` : ''}`;
}

/**
 * One comparison: the target's rows and the definition's for `scope`, each as the text
 * forms of its key columns and compared columns (byte for byte: `COLLATE "C"`). Both sides
 * stream into one hash aggregate, which counts each such row on either side; a row whose
 * counts differ is a difference. Returns the target's row count (`t_rows`) and the
 * differences (`diffs`: `{side: 't' | 'd', k, v}`, the side holding the row more often,
 * with its key's and values' texts as arrays).
 */
export function compareSql(shape: CheckShape, scope: Scope): string {
  const d = own('d');
  const u = own('u');
  const x = own('x');
  const keys = shape.key.map((_, i) => q(`k${i + 1}`));
  const values = shape.compared.map((_, i) => q(`v${i + 1}`));
  const columns = [...keys, ...values];
  const texts = (alias: string, names: string[]) =>
    names.map((name) => `(${alias}.${q(name)})::text COLLATE "C"`);
  const side = (alias: string) =>
    list(
      [
        ...texts(
          alias,
          shape.key.map((k) => k.name),
        ),
        ...texts(
          alias,
          shape.compared.map((c) => c.name),
        ),
      ].map((text, i) => `${text} AS ${columns[i]}`),
    );
  const asArray = (names: string[]) =>
    names.length === 0 ? "'[]'::json" : `json_build_array(${list(names.map((n) => `${x}.${n}`))})`;
  return `SELECT coalesce(sum(${x}.nt), 0)::float8 AS t_rows,
       coalesce(json_agg(json_build_object('side', CASE WHEN ${x}.nt > ${x}.nd THEN 't' ELSE 'd' END,
                                           'k', ${asArray(keys)}, 'v', ${asArray(values)})
                         ORDER BY ${list(keys.map((k) => `${x}.${k}`).concat(['1']))})
                  FILTER (WHERE ${x}.nt <> ${x}.nd), '[]'::json) AS diffs
  FROM (SELECT ${list(columns.map((c) => `${u}.${c}`))},
               count(*) FILTER (WHERE ${u}.target) AS nt, count(*) FILTER (WHERE NOT ${u}.target) AS nd
          FROM (SELECT true AS target, ${side('t')}
                  FROM ${shape.plan.targetSql} t
                 WHERE ${scope.target}
                UNION ALL
                SELECT false, ${side(d)}
                  FROM (${definitionSql(shape, scope.definition)}) ${d}) ${u}
         GROUP BY ${list(columns.map((c) => `${u}.${c}`))}) ${x}`;
}

/**
 * The key that ends a chunk of `$2` keys after `$1` (a text[], or NULL for the first), or
 * no row when fewer remain: driving keys read off the driving table, group keys (without a
 * NULL) off the target.
 */
export function chunkBoundarySql(shape: CheckShape): string {
  if (shape.kind === 'driving') return chunkEndSql(shape.plan);
  const t = targetKeyColumns(shape, 't');
  return `SELECT ARRAY[${list(t.map((c) => `${c}::text`))}] AS upto
    FROM ${shape.plan.targetSql} t
   WHERE ${notNull(t)} AND ($1::text[] IS NULL OR ${tuple(t)} > ${typedArray(
     shape.key.map((k) => k.type),
     '$1',
   )})
   ORDER BY ${list(t)}
  OFFSET $2::int - 1 LIMIT 1`;
}

/**
 * The changes the transform has yet to apply, as the `changed` CTE's body: the ledger
 * rows of its sources this transaction sees and its cursor's tick does not (`$1` the
 * tick's snapshot, `$2` this transaction's). Keys held for the whole transform are left
 * in: the classification asks about held keys on its own, first.
 */
/**
 * Locks, before the comparison's snapshot is taken (LOCK TABLE takes none), every table the
 * comparison reads that something may TRUNCATE meanwhile: the target and the key map and
 * group states (a rebuild, a recompute of every group: pages.ts), the ledger (its
 * generations are emptied once every cursor passed them: ledger-maintenance.ts) and the
 * sources (the app's TRUNCATE). TRUNCATE is not MVCC-safe: a repeatable-read snapshot
 * taken before it commits reads the table empty afterwards, which made differences lag
 * explains look like findings (no key map row to route a pending change to its old group,
 * no ledger row to call a key pending). Held, they make such a TRUNCATE wait for the
 * comparison instead, as a comparison's own reads would once they reached the table.
 */
export function snapshotLocksSql(schema: string, shape: CheckShape): string {
  const plan = shape.plan;
  const tables = new Set([
    plan.targetSql,
    ...plan.sources.map((s) => s.table),
    ...(plan.mapSql ? [plan.mapSql] : []),
    ...(plan.delta ? [plan.delta.statesSql] : []),
    `${quoteIdent(schema)}.ledger`,
  ]);
  return `LOCK TABLE ${[...tables].join(', ')} IN ACCESS SHARE MODE`;
}

export function pendingChangedSql(schema: string, shape: CheckShape): string {
  const ids = [...new Set(requireSourceIds(shape.plan).map((s) => s.sourceId))];
  const wide = requireSourceIds(shape.plan)
    .filter((s) => s.keyColumns.length > 1)
    .map((s) => s.sourceId);
  const decoded = wide.length
    ? `CASE WHEN l.source_id IN (${[...new Set(wide)].join(', ')}) THEN u.k::text[] ELSE ARRAY[u.k] END`
    : 'ARRAY[u.k]';
  return `SELECT l.source_id, ${decoded} AS key
    FROM ${q(schema)}.ledger l CROSS JOIN LATERAL unnest(l.keys) AS u(k)
   WHERE l.source_id IN (${ids.join(', ')}) AND ${inRange('l.xid', '$1', '$2')}`;
}

/** How many changed keys are pending (as above), and whether a TRUNCATE is among them. */
export function pendingStatsSql(schema: string, shape: CheckShape): string {
  const ids = [...new Set(requireSourceIds(shape.plan).map((s) => s.sourceId))];
  return `SELECT coalesce(sum(cardinality(l.keys)), 0)::float8 AS keys,
                 coalesce(bool_or(l.keys IS NULL), false) AS truncated
    FROM ${q(schema)}.ledger l
   WHERE l.source_id IN (${ids.join(', ')}) AND ${inRange('l.xid', '$1', '$2')}`;
}

/** The changes behind the keys the transform holds in quarantine (at any address). */
export function heldChangedSql(schema: string, shape: CheckShape): string {
  return `SELECT h.source_id, h.key FROM ${q(schema)}.held_keys h WHERE h.transform_id = ${shape.plan.id}`;
}

/**
 * What the changes in `changedSql` route to, as the drain routes them: returns `k`, each
 * such key as a text array (driving keys for a `driving` shape, target keys otherwise).
 * With `firstParam`, only those among the suspects in `$<firstParam>` (a JSON array; for
 * `groups`, the suspects with a NULL in `$<firstParam + 1>`); without, all of them.
 */
export function routedSql(
  shape: CheckShape,
  changedSql: string,
  firstParam: number | null,
): string {
  const p = `$${firstParam}`;
  if (shape.kind === 'driving') {
    const d = shape.driving;
    const names = d.keyColumns.map((_, i) => `k${i + 1}`);
    return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
affected AS MATERIALIZED (
     ${affectedDrivingKeys(shape.plan)}
)
SELECT DISTINCT ${asText(names)} AS k FROM affected${
      firstParam === null
        ? ''
        : `
 WHERE ${tuple(names)} IN (SELECT ${list(typedElement(d.keyTypes))} FROM jsonb_array_elements(${p}::jsonb) e)`
    }`;
  }
  if (shape.kind === 'total' || firstParam === null) {
    return affectedGroupsSql(shape.plan, changedSql, () => null);
  }
  const types = shape.key.map((k) => k.type);
  const typed = typedElement(types);
  return affectedGroupsSql(
    shape.plan,
    changedSql,
    (named) => `${tuple(named)} IN (SELECT ${list(typed)} FROM jsonb_array_elements(${p}::jsonb) e)
    OR EXISTS (SELECT 1 FROM jsonb_array_elements($${firstParam + 1}::jsonb) e
                WHERE ${named.map((n, i) => `${n} IS NOT DISTINCT FROM ${typed[i]}`).join(' AND ')})`,
  );
}
