import { quoteIdent } from '../identifiers.js';
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
  const set = list(written.map((c) => `${q(c.name)} = EXCLUDED.${q(c.name)}`));
  const conflict =
    plan.key.length === 0 ? 'ON CONFLICT ((true))' : `ON CONFLICT (${list(plan.key.map(q))})`;
  const side = (alias: string) => list(written.map((c) => `${alias}.${q(c.name)}`));
  return `INSERT INTO ${plan.targetSql} AS t (${columnList})
      SELECT ${columnList} FROM ${from}
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

export function selectList(plan: TransformPlan): string {
  return list(writtenColumns(plan).map((c) => `${c.expression} AS ${q(c.name)}`));
}
