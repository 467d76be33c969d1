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
import {
  type AnyColumn,
  type BuildColumns,
  Column,
  type ColumnsSelection,
  is,
  type NotNull,
  type SQL,
  Table,
  View,
} from 'drizzle-orm';
import { toCamelCase, toSnakeCase } from 'drizzle-orm/casing';
import {
  type ConvertCustomConfig,
  customType,
  type PgColumnBuilderBase,
  type PgCustomColumnBuilder,
  type PgTable,
  type PgView,
  type PgViewWithSelection,
  pgSchema,
  pgView,
} from 'drizzle-orm/pg-core';
import { TrellisError } from '../engine/errors.js';
import { assertIdentifier, quoteIdent } from '../engine/identifiers.js';
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

export type { TransformDefinition } from './target-key.js';

/** A source a statement can read: a drizzle table (aliases included) or another target. */
export type TransformSource = PgTable | AnyTrellisTarget;

type SourceName<S> = S extends { _: { name: infer N extends string } } ? N : never;

/** A column of one of the statement's sources (by the table name or alias it has). */
export type SourceColumn<TNames extends string> = AnyColumn<{ tableName: TNames }>;

/** A SELECT list: each key names a column of the target. */
export type Selection<TNames extends string> = Record<string, SourceColumn<TNames> | SQL<unknown>>;

type ItemShape<T, TNullable extends string> = T extends AnyColumn
  ? {
      data: T['_']['data'];
      notNull: T['_']['notNull'] extends true
        ? T['_']['tableName'] extends TNullable
          ? false
          : true
        : false;
    }
  : T extends SQL<infer D>
    ? { data: D; notNull: true }
    : never;

type TargetColumn<I extends { data: unknown; notNull: boolean }> = I['notNull'] extends true
  ? NotNull<
      PgCustomColumnBuilder<ConvertCustomConfig<'', { data: I['data']; driverData: unknown }>>
    >
  : PgCustomColumnBuilder<ConvertCustomConfig<'', { data: I['data']; driverData: unknown }>>;

/**
 * The target's columns as drizzle column builders: a column item keeps its data type (and
 * is nullable when its column is, or when its table is LEFT JOINed); a `sql<T>` item has
 * type `T` exactly (write `sql<number | null>` for an aggregate that can be NULL).
 */
export type TargetColumns<S, TNullable extends string> = {
  [K in keyof S]: TargetColumn<ItemShape<S[K], TNullable>>;
};

/** The typed, read-only drizzle object of a target: an existing view to drizzle. */
export type TrellisTarget<
  TName extends string,
  TColumns extends Record<string, PgColumnBuilderBase>,
> = PgViewWithSelection<TName, true, BuildColumns<TName, TColumns, 'pg'>>;

/** Any target `transform()` returned (to drizzle, an existing view with some columns). */
export type AnyTrellisTarget = PgView<string, true, ColumnsSelection>;

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
   * database, and how the target's columns are named from the select keys.
   * @defaultValue none: names are used as they are
   */
  casing?: Casing;
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
}

/** The statement being built: FROM, then any JOINs, then SELECT. */
export class TransformStart {
  /** @internal */
  readonly parts: Parts = { joins: [], withoutSourceIndex: false };

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

/** SELECT given; WHERE, GROUP BY, HAVING and WITHOUT SOURCE INDEX may follow. */
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
  const { statement, reads, columns } = render(name, built.parts, options.casing);
  const view = targetView(name, columns, options.schema);
  const definition: TransformDefinition = { target: name, statement, reads };
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

interface TargetColumnSpec {
  key: string;
  name: string;
  sqlType: string;
  notNull: boolean;
  decode: (value: unknown) => unknown;
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

function targetColumn(
  key: string,
  name: string,
  value: AnyColumn | SQL,
  nullable: ReadonlySet<string>,
): TargetColumnSpec {
  if (is(value, Column)) {
    const table = value.table as unknown as Table | View;
    const refName = is(table, View) ? viewRef(table as View).refName : tableRef(table).refName;
    return {
      key,
      name,
      sqlType: value.getSQLType(),
      notNull: value.notNull && !nullable.has(refName),
      decode: (v) => value.mapFromDriverValue(v),
    };
  }
  // A sql`…` item: its type is whatever its decoder (mapWith) says, else the driver's value.
  const decoder = (value as unknown as { decoder?: { mapFromDriverValue(v: unknown): unknown } })
    .decoder;
  return {
    key,
    name,
    sqlType: is(decoder, Column) ? (decoder as AnyColumn).getSQLType() : 'unknown',
    notNull: false,
    decode: (v) => (decoder ? decoder.mapFromDriverValue(v) : v),
  };
}

/** The drizzle object for the target: `pgView(name, columns).existing()`. */
function targetView(name: string, columns: TargetColumnSpec[], schema: string | undefined) {
  const builders: Record<string, PgColumnBuilderBase> = {};
  for (const c of columns) {
    const type = customType<{ data: unknown; driverData: unknown }>({
      dataType: () => c.sqlType,
      fromDriver: c.decode,
    });
    const builder = type(c.name);
    builders[c.key] = c.notNull ? builder.notNull() : builder;
  }
  // pgSchema('public') is refused by drizzle: the public schema is its default.
  return schema === undefined || schema === 'public'
    ? pgView(name, builders).existing()
    : pgSchema(schema).view(name, builders).existing();
}
