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
import { type AnyColumn, is, type SQL, Table, View } from 'drizzle-orm';
import { toCamelCase, toSnakeCase } from 'drizzle-orm/casing';
import type { PgTable } from 'drizzle-orm/pg-core';
import { TrellisError } from '../engine/errors.js';
import { assertIdentifier, quoteIdent } from '../engine/identifiers.js';
import { recordNeeds } from './indexes.js';
import {
  type Casing,
  ExpressionRenderer,
  type SourceRef,
  tableItem,
  tableRef,
  viewItem,
  viewRef,
} from './render.js';
import { definitionOn, TARGET_KEY, type TransformDefinition } from './target-key.js';
import {
  type AnyTrellisTarget,
  type TargetColumnSpec,
  type TargetColumns,
  type TrellisTarget,
  targetColumn,
  targetView,
} from './target-view.js';

export type { TransformDefinition } from './target-key.js';
export type { AnyTrellisTarget, TargetColumns, TrellisTarget } from './target-view.js';

/** A source a statement can read: a drizzle table (aliases included) or another target. */
export type TransformSource = PgTable | AnyTrellisTarget;

type SourceName<S> = S extends { _: { name: infer N extends string } } ? N : never;

/** A column of one of the statement's sources (by the table name or alias it has). */
export type SourceColumn<TNames extends string> = AnyColumn<{ tableName: TNames }>;

/** A SELECT list: each key names a column of the target. */
export type Selection<TNames extends string> = Record<string, SourceColumn<TNames> | SQL<unknown>>;

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

interface Join {
  kind: 'INNER' | 'LEFT';
  source: TransformSource;
  on: SQL | undefined;
}

interface Parts {
  from?: TransformSource;
  joins: Join[];
  selection?: Record<string, AnyColumn | SQL>;
  where?: SQL | undefined;
  groupBy?: Array<AnyColumn | SQL>;
  having?: SQL | undefined;
  withoutSourceIndex: boolean;
  withoutRowSecurity: boolean;
}

/** The statement being built: FROM, then any JOINs, then SELECT. */
export class TransformStart {
  /** @internal */
  readonly parts: Parts = { joins: [], withoutSourceIndex: false, withoutRowSecurity: false };

  /** `FROM source`: a drizzle table, an aliased table (`alias(t, 'a')`) or another target. */
  from<S extends TransformSource>(source: S): TransformSources<SourceName<S>, never> {
    this.parts.from = source;
    return new TransformSources(this.parts);
  }
}

/** FROM and JOINs given; SELECT comes next. */
export class TransformSources<TNames extends string, TNullable extends string> {
  /** @internal */
  constructor(readonly parts: Parts) {}

  /** `INNER JOIN source ON condition`. */
  innerJoin<S extends TransformSource>(
    source: S,
    on: SQL | undefined,
  ): TransformSources<TNames | SourceName<S>, TNullable> {
    this.parts.joins.push({ kind: 'INNER', source, on });
    return new TransformSources(this.parts);
  }

  /** `JOIN source ON condition` (an inner join). */
  join<S extends TransformSource>(
    source: S,
    on: SQL | undefined,
  ): TransformSources<TNames | SourceName<S>, TNullable> {
    return this.innerJoin(source, on);
  }

  /** `LEFT JOIN source ON condition`: the source's columns become nullable. */
  leftJoin<S extends TransformSource>(
    source: S,
    on: SQL | undefined,
  ): TransformSources<TNames | SourceName<S>, TNullable | SourceName<S>> {
    this.parts.joins.push({ kind: 'LEFT', source, on });
    return new TransformSources(this.parts);
  }

  /**
   * The SELECT list: each key names a target column, each value is a column of one of the
   * statement's tables or a `sql` expression over them.
   */
  select<S extends Selection<TNames>>(selection: S): TransformSelected<TNames, TNullable, S> {
    this.parts.selection = selection;
    return new TransformSelected(this.parts);
  }
}

/** SELECT given; WHERE, GROUP BY, HAVING, WITHOUT SOURCE INDEX and WITHOUT ROW SECURITY may follow. */
export class TransformSelected<
  TNames extends string,
  TNullable extends string,
  TSelection extends Selection<TNames>,
> {
  /** @internal */
  declare readonly _types: { names: TNames; nullable: TNullable; selection: TSelection };

  /** @internal */
  constructor(readonly parts: Parts) {}

  /** `WHERE condition`. */
  where(condition: SQL | undefined): this {
    this.parts.where = condition;
    return this;
  }

  /** `GROUP BY expr, …`: the target is keyed by these expressions. */
  groupBy(...expressions: Array<SourceColumn<TNames> | SQL>): this {
    this.parts.groupBy = expressions;
    return this;
  }

  /** `HAVING condition`. */
  having(condition: SQL | undefined): this {
    this.parts.having = condition;
    return this;
  }

  /** `WITHOUT SOURCE INDEX`: accept the source index gaps the drain's lookups have. */
  withoutSourceIndex(): this {
    this.parts.withoutSourceIndex = true;
    return this;
  }

  /**
   * `WITHOUT ROW SECURITY`: accept sources with row level security, whose target holds
   * every row Trellis's role reads, for whoever may read the target (ADR 0034).
   */
  withoutRowSecurity(): this {
    this.parts.withoutRowSecurity = true;
    return this;
  }
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
export function transform<
  TName extends string,
  TNames extends string,
  TNullable extends string,
  TSelection extends Selection<TNames>,
>(
  name: TName,
  build: (t: TransformStart) => TransformSelected<TNames, TNullable, TSelection>,
  options: TransformOptions = {},
): TrellisTarget<TName, TargetColumns<TSelection, TNullable>> {
  assertIdentifier('transform target', name);
  if (options.schema !== undefined) assertIdentifier('schema', options.schema);
  const built = build(new TransformStart());
  if (!(built instanceof TransformSelected)) {
    throw new TrellisError(
      'validation',
      `transform ${name}: the builder must return t.from(…).select(…) (with any clauses after it)`,
    );
  }
  const casing = casingOf(options.casing);
  const { statement, reads, columns } = render(name, built.parts, casing);
  const view = targetView(name, columns, options.schema, options.casing !== undefined);
  const names = new ExpressionRenderer([], casing);
  recordNeeds(view, built.parts.joins, built.parts.groupBy, (c) => names.columnName(c));
  const definition: TransformDefinition = { target: name, statement, reads };
  if (options.casing === undefined) {
    // No casing named here: the CLI renders it again with the drizzle config's (ADR 0063).
    Object.defineProperty(definition, 'withCasing', {
      value: (other: Casing): TransformDefinition => {
        const again = render(name, built.parts, other);
        return { target: name, statement: again.statement, reads: again.reads };
      },
      enumerable: false,
    });
  }
  Object.defineProperty(view, TARGET_KEY, { value: Object.freeze(definition), enumerable: false });
  return view as unknown as TrellisTarget<TName, TargetColumns<TSelection, TNullable>>;
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

function render(
  name: string,
  parts: Parts,
  casing: Casing | undefined,
): { statement: string; reads: string[]; columns: TargetColumnSpec[] } {
  const what = `transform ${name}`;
  if (!parts.from || !parts.selection) {
    throw new TrellisError('validation', `${what}: a statement needs FROM and SELECT`);
  }
  const refs: SourceRef[] = [];
  const nullable = new Set<string>();
  const reads: string[] = [];
  const item = (source: TransformSource, role: string): string => {
    const ref = sourceRef(source, `${what}: ${role}`);
    if (refs.some((r) => r.refName === ref.refName)) {
      throw new TrellisError(
        'validation',
        `${what}: ${ref.refName} is named twice: alias one of them (alias(table, 'name') from drizzle-orm/pg-core)`,
      );
    }
    refs.push(ref);
    if (is(source, View)) {
      reads.push(transformDefinition(source as AnyTrellisTarget).target);
      return viewItem(source as unknown as View);
    }
    return tableItem(source as Table);
  };
  const lines = [`TRANSFORM ${quoteIdent(name)}`, `FROM ${item(parts.from, 'FROM')}`];
  for (const join of parts.joins) {
    const joined = item(join.source, `${join.kind} JOIN`);
    const ref = refs[refs.length - 1] as SourceRef;
    if (join.kind === 'LEFT') nullable.add(ref.refName);
    if (join.on === undefined) {
      throw new TrellisError('validation', `${what}: JOIN ${ref.refName} needs an ON condition`);
    }
    const on = new ExpressionRenderer([...refs], casing).render(join.on, `JOIN ${ref.refName} ON`);
    lines.push(`${join.kind} JOIN ${joined} ON ${on}`);
  }
  const renderer = new ExpressionRenderer(refs, casing);
  const columns: TargetColumnSpec[] = [];
  const items: string[] = [];
  for (const [key, value] of Object.entries(parts.selection)) {
    const columnName = targetColumnName(key, casing);
    assertIdentifier(`${what}: column name`, columnName);
    if (columns.some((c) => c.name === columnName)) {
      throw new TrellisError('validation', `${what}: two select items name column ${columnName}`);
    }
    items.push(`${renderer.render(value, `SELECT item ${key}`)} AS ${quoteIdent(columnName)}`);
    columns.push(targetColumn(key, columnName, value, nullable));
  }
  if (items.length === 0) throw new TrellisError('validation', `${what}: SELECT lists no column`);
  lines.push(`SELECT ${items.join(', ')}`);
  if (parts.where !== undefined) lines.push(`WHERE ${renderer.render(parts.where, 'WHERE')}`);
  if (parts.groupBy !== undefined && parts.groupBy.length > 0) {
    const groups = parts.groupBy.map((g, i) => renderer.render(g, `GROUP BY item ${i + 1}`));
    lines.push(`GROUP BY ${groups.join(', ')}`);
  }
  if (parts.having !== undefined) lines.push(`HAVING ${renderer.render(parts.having, 'HAVING')}`);
  if (parts.withoutSourceIndex) lines.push('WITHOUT SOURCE INDEX');
  if (parts.withoutRowSecurity) lines.push('WITHOUT ROW SECURITY');
  return { statement: lines.join('\n'), reads, columns };
}

function sourceRef(source: TransformSource, what: string): SourceRef {
  if (is(source, Table)) return tableRef(source as Table);
  if (is(source, View) && isTrellisTarget(source)) return viewRef(source as unknown as View);
  throw new TrellisError(
    'validation',
    `${what}: a source is a drizzle table or another transform's target (views are not sources)`,
  );
}

/** A select key as a column name: drizzle's casing applied, as to a column declared unnamed. */
function targetColumnName(key: string, casing: Casing | undefined): string {
  if (casing === 'snake_case') return toSnakeCase(key);
  if (casing === 'camelCase') return toCamelCase(key);
  return key;
}
