/**
 * The source indexes a drizzle-built transform needs, as drizzle `index()`es an app
 * declares on its tables, so that drizzle-kit's migrations create them (in the migration's
 * transaction, with the table).
 *
 * The drain finds the rows a change touches through each JOIN equality (both of its sides)
 * and, for a GROUP BY, the rows of a group through its plain-column GROUP BY items: without
 * an index leading with one of those columns, each lookup reads the whole table. Trellis
 * reports what is missing (`status().sourceIndexGaps`); these are the same indexes, named
 * as Postgres names an unnamed `CREATE INDEX ON table (columns)`.
 */
import { type Column, is, SQL, StringChunk, Table } from 'drizzle-orm';
import {
  type ExtraConfigColumn,
  type IndexBuilder,
  index,
  type PgColumn,
  type PgTable,
} from 'drizzle-orm/pg-core';
import { TrellisError } from '../engine/errors.js';
import { isNestedSelect, tableRef } from './render.js';
import type { AnyTrellisTarget } from './target-view.js';

/** Why a source index is needed, as `SourceIndexGap.role` says. */
export type SourceIndexRole = 'group_by' | 'join_from' | 'join_joined';

/** A source index a transform needs. */
export interface SourceIndex {
  /** The table (an aliased one is its table), as declared with `pgTable`. */
  table: PgTable;
  /** Its columns, in the table's column order (one of them leading an index is enough). */
  columns: PgColumn[];
  /** Their names in the database (drizzle's casing applied). */
  names: string[];
  role: SourceIndexRole;
}

interface Need {
  source: Table;
  columns: Column[];
  /** The columns' names in the database (drizzle's casing applied). */
  names: string[];
  role: SourceIndexRole;
}

const needsOf = new WeakMap<object, readonly Need[]>();

/** @internal Records what `target`'s statement looks rows up by (transform() calls it). */
export function recordNeeds(
  target: object,
  joins: ReadonlyArray<{ source: unknown; on: SQL | undefined }>,
  groupBy: ReadonlyArray<unknown> | undefined,
  columnName: (column: Column) => string,
): void {
  const needs: Need[] = [];
  const add = (column: Column, role: SourceIndexRole) => {
    const source = column.table as Table;
    if (!is(source, Table)) return; // a column of a Trellis target (a view) read as a source
    if (isNestedSelect(source)) return; // a derived table's: its part's lookups are its own
    const need = needs.find((n) => sameRef(n.source, source) && n.role === role);
    if (!need) needs.push({ source, columns: [column], names: [columnName(column)], role });
    else if (!need.columns.some((c) => c.name === column.name)) {
      need.columns.push(column);
      need.names.push(columnName(column));
    }
  };
  for (const join of joins) {
    if (join.on === undefined || !is(join.source, Table)) continue;
    for (const [left, right] of equalities(join.on)) {
      for (const side of [left, right]) {
        add(side, sameRef(side.table as Table, join.source) ? 'join_joined' : 'join_from');
      }
    }
  }
  for (const item of groupBy ?? []) {
    if (isColumn(item)) add(item, 'group_by');
  }
  needsOf.set(target, needs);
}

function isColumn(value: unknown): value is Column {
  return (
    typeof value === 'object' &&
    value !== null &&
    'table' in value &&
    'name' in value &&
    !is(value, SQL)
  );
}

function sameRef(a: Table, b: Table): boolean {
  const x = tableRef(a);
  const y = tableRef(b);
  return x.refName === y.refName && x.schema === y.schema;
}

/**
 * The `column = column` conjuncts of an ON condition (`eq(a, b)`, `and(eq(…), eq(…))`, or
 * sql`${a} = ${b}`): what the drain looks rows up by.
 */
function equalities(on: SQL): Array<[Column, Column]> {
  const tokens: Array<Column | string> = [];
  const walk = (chunk: unknown) => {
    if (is(chunk, SQL)) {
      for (const c of chunk.queryChunks) walk(c);
    } else if (is(chunk, StringChunk)) {
      const text = chunk.value.join('');
      const last = tokens[tokens.length - 1];
      if (typeof last === 'string') tokens[tokens.length - 1] = last + text;
      else tokens.push(text);
    } else if (isColumn(chunk)) {
      tokens.push(chunk);
    } else {
      tokens.push('\u0000'); // a value or anything else: no equality of columns around it
    }
  };
  walk(on);
  const found: Array<[Column, Column]> = [];
  const opens = (s: unknown) => s === undefined || /(^|\(|\s+and\s+)\s*$/i.test(String(s));
  const closes = (s: unknown) => s === undefined || /^\s*($|\)|and\s)/i.test(String(s));
  for (let i = 0; i + 2 < tokens.length; i++) {
    const [a, eq, b] = [tokens[i], tokens[i + 1], tokens[i + 2]];
    if (a === undefined || b === undefined || typeof a === 'string' || typeof b === 'string')
      continue;
    if (typeof eq !== 'string') continue;
    if (eq.trim() !== '=' || !opens(tokens[i - 1]) || !closes(tokens[i + 3])) continue;
    found.push([a, b]);
  }
  return found;
}

/** A need's columns in the table's column order (as Postgres orders them by attnum). */
function ordered(need: Need): { columns: PgColumn[]; names: string[] } {
  const all = Object.values(
    (need.source as unknown as Record<symbol, Record<string, Column>>)[
      Symbol.for('drizzle:Columns')
    ] ?? {},
  );
  const position = (c: Column) => all.findIndex((x) => x.name === c.name);
  const order = need.columns
    .map((_, i) => i)
    .sort((a, b) => position(need.columns[a]!) - position(need.columns[b]!));
  return {
    columns: order.map((i) => need.columns[i] as PgColumn),
    names: order.map((i) => need.names[i]!),
  };
}

/** The source indexes `target`'s changes are looked up by (those of drizzle tables). */
export function sourceIndexesOf(target: AnyTrellisTarget): SourceIndex[] {
  const needs = needsOf.get(target);
  if (!needs)
    throw new TrellisError('validation', 'not a Trellis target: make it with transform()');
  return needs.map((n) => ({
    table: n.source as unknown as PgTable,
    columns: ordered(n).columns,
    names: ordered(n).names,
    role: n.role,
  }));
}

function tableOf(value: PgTable | Record<string, PgColumn>): Table {
  if (is(value, Table)) return value;
  const column = Object.values(value)[0];
  if (column === undefined || !is(column.table, Table)) {
    throw new TrellisError('validation', 'indexesFor takes a drizzle table, or its columns');
  }
  return column.table;
}

function tableName(table: Table): string {
  const t = table as unknown as Record<symbol, unknown>;
  return (t[Symbol.for('drizzle:OriginalName')] ?? t[Symbol.for('drizzle:Name')]) as string;
}

function tableSchema(table: Table): string | undefined {
  return (table as unknown as Record<symbol, string | undefined>)[Symbol.for('drizzle:Schema')];
}

/**
 * The drizzle `index()`es `table` needs for `targets`, for its `pgTable` extra config:
 *
 * ```ts
 * export const orders = pgTable('orders', { … }, (t): IndexBuilder[] => indexesFor(t, customerRevenue));
 * ```
 *
 * `tableOrColumns` is the table, or the columns drizzle passes to that function (whose
 * table they are). The targets may be defined after the table: drizzle-kit calls the
 * function when it reads the schema.
 *
 * Each is named as Postgres names `CREATE INDEX ON orders (customer_id)`
 * (`orders_customer_id_idx`), one per table and role, once however many targets need it;
 * none where a primary key or unique column of the table leads an index already.
 * Declare these instead of an index of your own that leads with one of their columns.
 */
export function indexesFor(
  tableOrColumns: PgTable | Record<string, PgColumn>,
  ...targets: AnyTrellisTarget[]
): IndexBuilder[] {
  const table = tableOf(tableOrColumns);
  const builders = new Map<string, IndexBuilder>();
  for (const target of targets) {
    for (const need of sourceIndexesOf(target)) {
      if (tableName(need.table) !== tableName(table)) continue;
      if (tableSchema(need.table) !== tableSchema(table)) continue;
      // A primary key or unique column has its index already: it leads that one.
      if (need.columns.some((c) => c.primary || c.isUnique)) continue;
      const name = `${tableName(table)}_${need.names.join('_')}_idx`;
      if (builders.has(name)) continue;
      // index().on() takes the columns drizzle gives the table's extra config.
      const extra = Object.values(
        (table as unknown as Record<symbol, Record<string, ExtraConfigColumn>>)[
          Symbol.for('drizzle:ExtraConfigColumns')
        ] ?? {},
      );
      const [first, ...rest] = need.columns.map(
        (c) => extra.find((x) => x.name === c.name) ?? (c as unknown as ExtraConfigColumn),
      );
      builders.set(name, index(name).on(first!, ...rest));
    }
  }
  return [...builders.values()];
}
