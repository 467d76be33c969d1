/**
 * The drizzle object for a transform's target: `pgView(name, columns).existing()`, whose
 * columns are typed and decoded like the SELECT items they come from. drizzle-kit records an
 * existing view and writes no DDL for it.
 */
import {
  type AnyColumn,
  type BuildColumns,
  Column,
  type ColumnsSelection,
  is,
  type NotNull,
  type SQL,
  type Table,
  View,
} from 'drizzle-orm';
import {
  type ConvertCustomConfig,
  customType,
  type PgColumnBuilderBase,
  type PgCustomColumnBuilder,
  type PgView,
  type PgViewWithSelection,
  pgSchema,
  pgView,
} from 'drizzle-orm/pg-core';
import { tableRef, viewRef } from './render.js';

/** A select item's data type and whether it is NOT NULL (`nullable`: LEFT JOINed tables). */
export type ItemShape<T, TNullable extends string> = T extends AnyColumn
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

/** A target column's data type and nullability, as the builder's types carry it. */
export interface ColumnShape {
  data: unknown;
  notNull: boolean;
}

/** Each select key's {@link ColumnShape}. */
export type SelectionShape<S, TNullable extends string> = {
  [K in keyof S]: ItemShape<S[K], TNullable>;
};

/** The target's columns as drizzle column builders, from each column's shape. */
export type ShapeColumns<TShape extends Record<string, ColumnShape>> = {
  [K in keyof TShape]: TargetColumn<TShape[K]>;
};

/** The typed, read-only drizzle object of a target: an existing view to drizzle. */
export type TrellisTarget<
  TName extends string,
  TColumns extends Record<string, PgColumnBuilderBase>,
> = PgViewWithSelection<TName, true, BuildColumns<TName, TColumns, 'pg'>>;

/** Any target `transform()` returned (to drizzle, an existing view with some columns). */
export type AnyTrellisTarget = PgView<string, true, ColumnsSelection>;

/** A target column: its select key, database name, the type drizzle-kit records, decoder. */
export interface TargetColumnSpec {
  key: string;
  name: string;
  sqlType: string;
  notNull: boolean;
  decode: (value: unknown) => unknown;
}

/** The target column a select item makes (`nullable`: the LEFT JOINed tables' names). */
export function targetColumn(
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

/**
 * The drizzle object for the target: `pgView(name, columns).existing()`. With `named`
 * false (the transform named no casing), its columns are declared without a name, as an
 * app's own unnamed columns are: the `drizzle()` database's casing names them when it
 * queries, as drizzle-kit's casing named them when `trellis generate transform --from`
 * followed the drizzle config (with no casing anywhere, a column is named by its key).
 */
export function targetView(
  name: string,
  columns: TargetColumnSpec[],
  schema: string | undefined,
  named = true,
) {
  const builders = columnBuilders(columns, named);
  // pgSchema('public') is refused by drizzle: the public schema is its default.
  return schema === undefined || schema === 'public'
    ? pgView(name, builders).existing()
    : pgSchema(schema).view(name, builders).existing();
}

/**
 * drizzle column builders for the columns, by select key: named when `named` (or when
 * the name is not the key), else unnamed, for the `drizzle()` database's casing to name.
 */
export function columnBuilders(
  columns: readonly TargetColumnSpec[],
  named: boolean,
): Record<string, PgColumnBuilderBase> {
  const builders: Record<string, PgColumnBuilderBase> = {};
  for (const c of columns) {
    const type = customType<{ data: unknown; driverData: unknown }>({
      dataType: () => c.sqlType,
      fromDriver: c.decode,
    });
    const builder = named || c.name !== c.key ? type(c.name) : type();
    builders[c.key] = c.notNull ? builder.notNull() : builder;
  }
  return builders;
}
