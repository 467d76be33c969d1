/**
 * `derived(alias, s => s.from(…).select(…)…)`: a subquery in FROM (a derived table), as a
 * drizzle table whose columns are the SELECT's keys, typed as a target's would be. The
 * statement names it like any table (`t.from(perCustomer)`, `perCustomer.total`) and
 * writes it as `(SELECT …) AS alias`, in the AS form; the engine keeps it as a hidden part
 * (ADR 0056).
 */
import { pgTable } from 'drizzle-orm/pg-core';
import { TrellisError } from '../engine/errors.js';
import { assertIdentifier, quoteIdent } from '../engine/identifiers.js';
import {
  type Shape,
  TransformSelected,
  TransformSetOperation,
  TransformStart,
  type TransformStatement,
} from './builder.js';
import { nestedSelect, type RenderScope } from './render.js';
import { renderSelect } from './select.js';
import { renderSetOperation } from './set-operations.js';
import { columnBuilders, type ShapeColumns, type TargetColumnSpec } from './target-view.js';

/** The SELECT's text and columns (`casing` names them), for the FROM item or the types. */
function renderInner(
  built: TransformStatement<unknown>,
  alias: string,
  scope: RenderScope,
): { text: string; columns: TargetColumnSpec[] } {
  const what = `derived table ${alias}`;
  if (built instanceof TransformSetOperation) {
    const { lines, columns, options } = renderSetOperation(built.branches, what, scope);
    if (
      options.length > 0 ||
      built.options.withoutSourceIndex ||
      built.options.withoutRowSecurity
    ) {
      throw new TrellisError('validation', `${what}: options belong to the whole statement`);
    }
    return { text: lines.join(' '), columns };
  }
  const { parts } = built as TransformSelected<string, string, never>;
  if (parts.withoutSourceIndex || parts.withoutRowSecurity) {
    throw new TrellisError('validation', `${what}: options belong to the whole statement`);
  }
  const rendered = renderSelect(parts, what, scope);
  return { text: rendered.viewSql.join(' '), columns: rendered.columns };
}

/**
 * A derived table for a statement's FROM or JOIN: `alias`, with the columns `build`'s
 * SELECT makes (a GROUP BY, a set operation, a top-N… anything a statement's builder
 * writes). Its columns are typed as a target's (`perCustomer.total`).
 */
export function derived<TAlias extends string, TShape extends Shape>(
  alias: TAlias,
  build: (s: TransformStart) => TransformStatement<TShape>,
) {
  assertIdentifier('derived table alias', alias);
  const built = build(new TransformStart());
  if (!(built instanceof TransformSelected) && !(built instanceof TransformSetOperation)) {
    throw new TrellisError(
      'validation',
      `derived table ${alias}: the builder must return s.from(…).select(…) (with any clauses after it)`,
    );
  }
  // Types and decoders do not depend on the casing: the columns are declared unnamed, for
  // the statement's casing to name them as it names the SELECT's.
  const { columns } = renderInner(built, alias, { casing: undefined, reads: [], viewSql: false });
  const table = pgTable(alias, columnBuilders(columns, false) as ShapeColumns<TShape>);
  return nestedSelect(
    table,
    (_outer, scope) => `(${renderInner(built, alias, scope).text}) AS ${quoteIdent(alias)}`,
  );
}
