import { quoteIdent } from '../identifiers.js';
import type { PlanColumn, PlanSource, TransformPlan } from './plan.js';

/** Pieces of SQL every re-derivation statement is built from. Identifiers always quoted. */

export const q = quoteIdent;

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
export function upsert(plan: TransformPlan, from: string): string {
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
