/**
 * `transform()`: a TRANSFORM statement built from drizzle tables, and the target it
 * defines as a typed, read-only drizzle object.
 *
 * The target is a drizzle view declared `.existing()` (`pgView(name, columns).existing()`),
 * so `db.select().from(target)` is typed by what the SELECT produces, and drizzle-kit never
 * writes DDL for it: Trellis creates and owns the table. The statement travels on the same
 * object (`statementOf(target)`), so one export serves the app's reads, drizzle-kit's schema
 * and `trellis generate transform --from`.
 */
import { TrellisError } from '../engine/errors.js';
import { assertIdentifier, quoteIdent } from '../engine/identifiers.js';
import {
  type Selection,
  type Shape,
  type TransformStart as Start,
  TransformSelected,
  TransformSetOperation,
  TransformStart,
  type TransformStatement,
} from './builder.js';
import { recordNeeds } from './indexes.js';
import { type Casing, ExpressionRenderer, type RenderScope } from './render.js';
import { renderSelect } from './select.js';
import { renderSetOperation } from './set-operations.js';
import { definitionOn, TARGET_KEY, type TransformDefinition } from './target-key.js';
import {
  type AnyTrellisTarget,
  type ShapeColumns,
  type TargetColumnSpec,
  type TrellisTarget,
  targetView,
} from './target-view.js';

export {
  type Selection,
  type SetOperator,
  type SourceColumn,
  type TopNOptions,
  TransformSelected,
  TransformSetOperation,
  TransformSources,
  TransformStart,
  type TransformStatement,
} from './builder.js';
export type { TransformSource } from './select.js';
export type { TransformDefinition } from './target-key.js';
export type { AnyTrellisTarget, TargetColumns, TrellisTarget } from './target-view.js';

/** Options of {@link transform}. */
export interface TransformOptions {
  /**
   * The instance's target schema, where Trellis creates the target (`Trellis.connect`'s
   * `targetSchema`). Only the drizzle object uses it: the statement names the target alone.
   * @defaultValue `'public'`
   */
  schema?: string;
  /**
   * drizzle's `casing` option, when the app uses one (`drizzle({ casing })` and
   * drizzle-kit's `casing`): how columns declared without a name are named in the
   * database, and how the target's columns are named from the select keys. Give the app's
   * `drizzle()` database itself to follow whatever casing it was made with (`{ casing: db }`):
   * with `casing: 'snake_case'` there, `select({ customerId: … })` makes a `customer_id`
   * column, read back by drizzle as `customerId`.
   * @defaultValue none: names are used as they are
   */
  casing?: Casing | DrizzleDatabase | undefined;
}

/** A `drizzle()` database (any Postgres driver's), whose casing a transform can follow. */
export interface DrizzleDatabase {
  /** drizzle's own; only its presence is used to tell a database from a casing name. */
  readonly _: object;
}

/**
 * The casing a `drizzle()` database was made with: read from its dialect, which converts
 * names declared without one (drizzle keeps the option in no public field).
 */
export function casingOf(option: Casing | DrizzleDatabase | undefined): Casing | undefined {
  if (option === undefined || option === 'snake_case' || option === 'camelCase') return option;
  const convert = (option as { dialect?: { casing?: { convert?: unknown } } }).dialect?.casing
    ?.convert;
  if (typeof convert !== 'function') {
    throw new TrellisError(
      'validation',
      `casing is 'snake_case', 'camelCase' or a drizzle() database, not ${typeof option === 'string' ? `'${option}'` : 'this object'}`,
    );
  }
  const name = convert as (name: string) => string;
  if (name('customerId') === 'customer_id') return 'snake_case';
  if (name('customer_id') === 'customerId') return 'camelCase';
  return undefined;
}

/**
 * Defines a transform from drizzle tables and returns its target as a typed, read-only
 * drizzle object; `statementOf(target)` gives the statement.
 *
 * ```ts
 * export const customerTotals = transform('customer_totals', (t) =>
 *   t.from(orders)
 *     .innerJoin(customers, eq(orders.customerId, customers.id))
 *     .select({ customerId: orders.customerId, name: customers.name, total: sql<string>`sum(${orders.amount})` })
 *     .groupBy(orders.customerId, customers.name),
 * );
 * const rows = await db.select().from(customerTotals); // { customerId: number; name: string; total: string }[]
 * ```
 *
 * Throws a `validation` TrellisError for a statement that cannot be written: a name
 * Postgres would refuse, a column or table that is not one of the statement's sources, a
 * value with no literal. Everything else (types, keys, what Postgres accepts) is checked
 * when the statement is applied.
 */
export function transform<TName extends string, TShape extends Shape>(
  name: TName,
  build: (t: Start) => TransformStatement<TShape>,
  options: TransformOptions = {},
): TrellisTarget<TName, ShapeColumns<TShape>> {
  assertIdentifier('transform target', name);
  if (options.schema !== undefined) assertIdentifier('schema', options.schema);
  const built = build(new TransformStart());
  if (!(built instanceof TransformSelected) && !(built instanceof TransformSetOperation)) {
    throw new TrellisError(
      'validation',
      `transform ${name}: the builder must return t.from(…).select(…) (with any clauses after it)`,
    );
  }
  const casing = casingOf(options.casing);
  const { statement, reads, columns } = render(name, built, casing);
  const view = targetView(name, columns, options.schema, options.casing !== undefined);
  // The lookups of the statement's joins and GROUP BY (each SELECT's, for a set operation).
  const selects =
    built instanceof TransformSelected ? [built.parts] : built.branches.map((b) => b.parts);
  const names = new ExpressionRenderer([], casing);
  recordNeeds(
    view,
    selects.flatMap((p) => p.joins),
    selects.flatMap((p) => p.groupBy ?? []),
    (c) => names.columnName(c),
  );
  const definition: TransformDefinition = { target: name, statement, reads };
  if (options.casing === undefined) {
    // No casing named here: the CLI renders it again with the drizzle config's (ADR 0063).
    Object.defineProperty(definition, 'withCasing', {
      value: (other: Casing): TransformDefinition => {
        const again = render(name, built, other);
        return { target: name, statement: again.statement, reads: again.reads };
      },
      enumerable: false,
    });
  }
  Object.defineProperty(view, TARGET_KEY, { value: Object.freeze(definition), enumerable: false });
  return view as unknown as TrellisTarget<TName, ShapeColumns<TShape>>;
}

/** Whether a value is a target `transform()` returned. */
export function isTrellisTarget(value: unknown): value is AnyTrellisTarget {
  return definitionOn(value) !== undefined;
}

/** What `transform()` recorded on a target: its name, statement and the targets it reads. */
export function transformDefinition(target: AnyTrellisTarget): TransformDefinition {
  const definition = definitionOn(target);
  if (!definition) {
    throw new TrellisError('validation', 'not a Trellis target: make it with transform()');
  }
  return definition;
}

/** The TRANSFORM statement of a target `transform()` returned. */
export function statementOf(target: AnyTrellisTarget): string {
  return transformDefinition(target).statement;
}

/**
 * The statement's text: the FROM-first form when it has only what that form writes,
 * else the AS form (view SQL: a subquery, DISTINCT ON, top-N, a set operation).
 */
function render(
  name: string,
  built: TransformSelected<string, string, Selection<string>> | TransformSetOperation<unknown>,
  casing: Casing | undefined,
): { statement: string; reads: string[]; columns: TargetColumnSpec[] } {
  const what = `transform ${name}`;
  const scope: RenderScope = { casing, reads: [], viewSql: false };
  const head = `TRANSFORM ${quoteIdent(name)}`;
  if (built instanceof TransformSetOperation) {
    const { lines, columns, options } = renderSetOperation(built.branches, what, scope);
    const trailing = [
      ...options,
      ...(built.options.withoutSourceIndex && !options.includes('WITHOUT SOURCE INDEX')
        ? ['WITHOUT SOURCE INDEX']
        : []),
      ...(built.options.withoutRowSecurity && !options.includes('WITHOUT ROW SECURITY')
        ? ['WITHOUT ROW SECURITY']
        : []),
    ];
    const statement = [`${head} AS`, ...lines, ...trailing].join('\n');
    return { statement, reads: scope.reads, columns };
  }
  const { parts } = built;
  const rendered = renderSelect(parts, what, scope);
  const lines =
    rendered.needsViewSql || scope.viewSql
      ? [`${head} AS`, ...rendered.viewSql]
      : [head, ...rendered.fromFirst];
  if (parts.withoutSourceIndex) lines.push('WITHOUT SOURCE INDEX');
  if (parts.withoutRowSecurity) lines.push('WITHOUT ROW SECURITY');
  return { statement: lines.join('\n'), reads: scope.reads, columns: rendered.columns };
}
