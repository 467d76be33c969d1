/**
 * `subquery()`: a SELECT written with the builder, for drizzle's own `exists()`,
 * `notExists()`, `inArray()` and `notInArray()` (and anywhere a `sql` template takes a
 * value: a scalar subquery). Its tables are sources of the statement like any other: the
 * statement is written in the AS form, whose subqueries the engine keeps as hidden parts
 * (ADRs 0057, 0058), so their changes reach the target.
 *
 * ```ts
 * transform('active_customers', (t) =>
 *   t.from(customers)
 *     .select({ id: customers.id, name: customers.name })
 *     .where(exists(subquery((s) =>
 *       s.from(orders).select({ one: sql`1` }).where(eq(orders.customerId, customers.id))))),
 * );
 * ```
 */
import type { SQL, SQLWrapper } from 'drizzle-orm';
import { TrellisError } from '../engine/errors.js';
import { type Selection, TransformSelected, TransformStart } from './builder.js';
import { nestedSelect } from './render.js';
import { renderSelect } from './select.js';

/** A builder SELECT inside an expression: only a transform's statement can write it. */
export interface TransformSubquery<TSelection> extends SQLWrapper {
  /** @internal the SELECT list, for the types only */
  readonly _selection: TSelection;
}

/**
 * A subquery for a transform's WHERE (or any expression of it): `(s) =>
 * s.from(…)…select(…)…`, as the statement's own builder, whose conditions may name the
 * columns of the statement around it (a correlated subquery).
 */
export function subquery<
  TNames extends string,
  TNullable extends string,
  TSelection extends Selection<TNames>,
>(
  build: (s: TransformStart) => TransformSelected<TNames, TNullable, TSelection>,
): TransformSubquery<TSelection> {
  const built = build(new TransformStart());
  if (!(built instanceof TransformSelected)) {
    throw new TrellisError(
      'validation',
      'subquery(): the builder must return s.from(…).select(…) (with any clauses after it)',
    );
  }
  const { parts } = built;
  if (parts.withoutSourceIndex || parts.withoutRowSecurity) {
    throw new TrellisError(
      'validation',
      'subquery(): WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY are options of the whole statement',
    );
  }
  const value = {
    getSQL(): SQL {
      // Only a transform's renderer writes it (with the statement's sources in scope).
      throw new TrellisError('validation', "a subquery() is part of a transform's statement only");
    },
  };
  return nestedSelect(value, (outer, scope) =>
    renderSelect(parts, 'subquery', scope, outer).viewSql.join(' '),
  ) as unknown as TransformSubquery<TSelection>;
}
