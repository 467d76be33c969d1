import { quoteIdent, quoteLiteral } from '../identifiers.js';
import type { PlanColumn, PlanSource, TransformPlan } from './plan.js';

/** Pieces of SQL every re-derivation statement is built from. Identifiers always quoted. */

export const q = quoteIdent;

/**
 * Names the engine introduces in generated SQL where a definition's expressions are in
 * scope (aliases, CTE columns) start with this; no source alias or column may (the
 * analysis refuses them), so an expression can never resolve to one of them.
 */
export const OWN_PREFIX = 'trellis#';

/** One of the engine's own names (see OWN_PREFIX), quoted. */
export function own(name: string): string {
  return q(`${OWN_PREFIX}${name}`);
}

export function col(alias: string, name: string): string {
  return `${q(alias)}.${q(name)}`;
}

export function list(items: string[]): string {
  return items.join(', ');
}

/** The changed keys of `source`, cast back from text to the key columns' types. */
export function typedKeys(source: PlanSource, from = 'c'): string[] {
  return source.keyTypes.map((type, i) => `(${from}.key[${i + 1}])::${type}`);
}

/** One expression as is, several as a row: for IN and row comparisons. */
export function tuple(items: string[]): string {
  return items.length === 1 ? items[0]! : `(${list(items)})`;
}

/** A text[] parameter cast to a source's key types, as a row. */
export function typedParam(source: PlanSource, param: string): string {
  return tuple(source.keyTypes.map((type, i) => `((${param}::text[])[${i + 1}])::${type}`));
}

/** Columns written by the drain: every column but the paused ones (left as they are). */
export function writtenColumns(plan: TransformPlan): PlanColumn[] {
  return plan.columns.filter((c) => !c.paused || c.isKey);
}

export function requireSourceIds(plan: TransformPlan): Array<PlanSource & { sourceId: number }> {
  return plan.sources.map((s) => {
    if (s.sourceId === null) {
      throw new Error(`capture of ${s.alias} is not installed yet for transform ${plan.target}`);
    }
    return s as PlanSource & { sourceId: number };
  });
}

/**
 * Writes the rows of `from` into the target: new keys inserted, existing ones updated.
 * Rows whose value images are all the same are not rewritten: no churn, and nothing for a
 * chained transform's capture to pick up. Images, not `=` (ENGINE.md, capture): 1.00
 * replaces 1.0, -0 replaces 0, 'A' replaces 'a' under citext; and a key that changed only
 * so (equal under the key's `=`, so the conflict is on the same row) is rewritten too.
 * `record_image_ne` as a function: the operator would be applied per column between two
 * ROW constructors. (MERGE costs less per row, but cannot sit in a WITH before Postgres 17.)
 */
export function upsert(plan: TransformPlan, from: string): string {
  const written = writtenColumns(plan);
  const columnList = list(written.map((c) => q(c.name)));
  // A column held for the row's driving key keeps its last value.
  const held = new Set(plan.aggregates ? [] : plan.heldColumns);
  const drivingKeys = (plan.sources[0]!.targetKeyColumns ?? []).map((k) => `t.${q(k)}`);
  const set = list(
    written.map((c) =>
      held.has(c.name)
        ? `${q(c.name)} = CASE WHEN ${heldFor(plan, c.name, drivingKeys)} THEN t.${q(c.name)} ELSE EXCLUDED.${q(c.name)} END`
        : `${q(c.name)} = EXCLUDED.${q(c.name)}`,
    ),
  );
  const conflict =
    plan.key.length === 0 ? 'ON CONFLICT ((true))' : `ON CONFLICT (${list(plan.key.map(q))})`;
  const side = (alias: string) => list(written.map((c) => `${alias}.${q(c.name)}`));
  // A GROUP BY's pages may upsert the same groups at once (ranges.ts): in key order, so
  // they wait for each other rather than deadlock.
  const order = plan.aggregates && plan.key.length > 0 ? ` ORDER BY ${list(plan.key.map(q))}` : '';
  return `INSERT INTO ${plan.targetSql} AS t (${columnList})
      SELECT ${columnList} FROM ${from}${order}
      ${conflict} DO UPDATE SET ${set}
      WHERE record_image_ne(ROW(${side('t')}), ROW(${side('EXCLUDED')}))`;
}

export function keyMatch(plan: TransformPlan, left: string, right: string): string {
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
 * Whether the key held for column `column` is the driving row's whose key columns are
 * `keys` (typed expressions, in key order): see heldColumns in plan.ts.
 */
function heldFor(plan: TransformPlan, column: string, keys: string[]): string {
  const driving = plan.sources[0]!;
  const h = own('h');
  return `EXISTS (SELECT 1 FROM ${plan.catalog}.held_keys ${h}
     WHERE ${h}.transform_id = ${plan.id} AND ${h}.column_name = ${quoteLiteral(column)}
       AND ${h}.source_id = ${driving.sourceId ?? 'NULL'}
       AND ${keys.map((k, i) => `(${h}.key[${i + 1}])::${driving.keyTypes[i]} = ${k}`).join(' AND ')})`;
}

/**
 * The written columns, computed from the sources. A column some driving keys are held
 * for is not computed for their rows (its expression fails there): NULL, which the
 * upsert does not write over the row's last value (see `upsert`).
 */
export function selectList(plan: TransformPlan): string {
  const held = new Set(plan.aggregates ? [] : plan.heldColumns);
  const driving = plan.sources[0]!;
  const drivingKeys = driving.keyColumns.map((k) => col(driving.alias, k));
  return list(
    writtenColumns(plan).map((c) =>
      held.has(c.name)
        ? `CASE WHEN ${heldFor(plan, c.name, drivingKeys)} THEN NULL ELSE ${c.expression} END AS ${q(c.name)}`
        : `${c.expression} AS ${q(c.name)}`,
    ),
  );
}

/**
 * `restriction AND where`, with the transform's WHERE evaluated only on rows the
 * restriction keeps. Postgres may evaluate a WHERE on every row a scan reads before a
 * join or semi-join narrows them to the keys being re-derived (a sequential scan under a
 * hash join does), and one row anywhere that fails it (a division by zero) would fail
 * every re-derivation, so every changed key would be held with it. A CASE is evaluated
 * lazily, row by row: its WHEN decides first. The restriction stays outside the CASE too,
 * for the planner to use (an index, a semi-join).
 */
export function restrictedWhere(restriction: string, where: string | null): string {
  if (!where) return restriction;
  return `(${restriction}) AND CASE WHEN (${restriction}) THEN (${where}) END`;
}
