import fc from 'fast-check';
import { COLUMN_TYPES, type ColumnType, SQL_TYPE, value } from './random-values.js';

/**
 * Random schemas for the differential tests: one to three tables (logical names a, b, c),
 * each with a primary key (int, text, text under the case-insensitive collation, or two
 * columns), one to four columns of assorted types (nullable or not), and, for every other
 * table, columns holding that table's key (nullable: `to_b`, or `to_b1`, `to_b2` for a
 * two-column key), through which the tables join. Plus the rows each starts with.
 */
export type KeyKind = 'int' | 'text' | 'text_ci' | 'pair';

export interface Column {
  name: string;
  type: ColumnType;
  notNull: boolean;
}

export interface Table {
  /** Logical name (a, b, c); the physical one carries the case's prefix. */
  name: string;
  key: KeyKind;
  /** Columns other than the key and the references. */
  data: Column[];
}

export interface Schema {
  tables: Table[];
}

export interface Database {
  schema: Schema;
  /** Each table's first rows, each row its values (literals) in `columnsOf` order. */
  rows: string[][][];
}

export const TABLE_NAMES = ['a', 'b', 'c'] as const;

export function keyColumns(table: Pick<Table, 'key'>): Column[] {
  switch (table.key) {
    case 'int':
      return [{ name: 'id', type: 'int', notNull: true }];
    case 'text':
      return [{ name: 'id', type: 'text', notNull: true }];
    case 'text_ci':
      return [{ name: 'id', type: 'text_ci', notNull: true }];
    case 'pair':
      return [
        { name: 'k1', type: 'int', notNull: true },
        { name: 'k2', type: 'text', notNull: true },
      ];
  }
}

/** The columns a table holds the key of `other` in (same types and collations, nullable). */
export function refColumns(other: Table): Column[] {
  const keys = keyColumns(other);
  return keys.map((k, i) => ({
    name: keys.length === 1 ? `to_${other.name}` : `to_${other.name}${i + 1}`,
    type: k.type,
    notNull: false,
  }));
}

/** Every column of `table`, in table order: key, data, references. */
export function columnsOf(schema: Schema, table: Table): Column[] {
  return [
    ...keyColumns(table),
    ...table.data,
    ...schema.tables.filter((t) => t !== table).flatMap((other) => refColumns(other)),
  ];
}

/** The physical name of a logical table (or target) in a case with prefix `prefix`. */
export function physical(prefix: string, name: string): string {
  return `${prefix}_${name}`;
}

/** Key values a table's rows draw from: few, so writers collide and keys get reused. */
const KEY_POOLS: Record<KeyKind, readonly string[][]> = {
  int: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map((k) => [String(k)]),
  text: ["'k1'", "'k2'", "'K2'", "'k3'", "'k4'", "'k5'", "'long'", "'k 6'"].map((k) => [k]),
  // 'k2' and 'K2' are one key under ci: writing one where the other is collides.
  text_ci: ["'k1'", "'k2'", "'K2'", "'k3'", "'K3'", "'k4'", "'é'", "'É'"].map((k) => [k]),
  pair: [1, 2, 3].flatMap((k1) => ["'x'", "'y'", "'X'"].map((k2) => [String(k1), k2])),
};

/** A key of a table of kind `kind`, as its columns' literals. */
export function keyValue(kind: KeyKind): fc.Arbitrary<string[]> {
  return fc.constantFrom(...KEY_POOLS[kind]);
}

/** Two keys are the same row's under the key's equality (case-blind under ci). */
export function sameKey(kind: KeyKind, x: string[], y: string[]): boolean {
  const norm = (k: string[]) => (kind === 'text_ci' ? k.map((v) => v.toLowerCase()) : k);
  return JSON.stringify(norm(x)) === JSON.stringify(norm(y));
}

/** A reference to `other`: one of its keys (present or not), or NULL. */
export function refValue(other: Table): fc.Arbitrary<string[]> {
  const nulls = keyColumns(other).map(() => 'NULL');
  return fc.oneof(
    { arbitrary: keyValue(other.key), weight: 4 },
    { arbitrary: fc.constant(nulls), weight: 1 },
  );
}

/** A whole row of `table`, as literals in `columnsOf` order (key given). */
export function rowValues(schema: Schema, table: Table, key: string[]): fc.Arbitrary<string[]> {
  const others = schema.tables.filter((t) => t !== table);
  return fc
    .tuple(
      fc.tuple(...table.data.map((c) => value(c.type, !c.notNull))),
      fc.tuple(...others.map((o) => refValue(o))),
    )
    .map(([data, refs]) => [...key, ...data, ...refs.flat()]);
}

/** Column names say their type: `num2` is numeric, `ci3` text under ci, `cit1` citext. */
const COLUMN_PREFIX: Record<ColumnType, string> = {
  int: 'i',
  bigint: 'big',
  numeric: 'num',
  numeric_2: 'dec',
  float8: 'f',
  text: 't',
  citext: 'cit',
  text_ci: 'ci',
  boolean: 'bool',
  date: 'day',
  jsonb: 'j',
};

const column = (index: number) =>
  fc
    .record({ type: fc.constantFrom(...COLUMN_TYPES), notNull: fc.boolean() })
    .map(({ type, notNull }) => ({ name: `${COLUMN_PREFIX[type]}${index}`, type, notNull }));

const tableArb = (name: string) =>
  fc.record({
    name: fc.constant(name),
    key: fc.constantFrom<KeyKind>('int', 'int', 'text', 'text_ci', 'pair'),
    data: fc
      .array(fc.nat(), { minLength: 1, maxLength: 4 })
      .chain((slots) => fc.tuple(...slots.map((_, i) => column(i + 1)))),
  });

export function schemaArb(maxTables = 3): fc.Arbitrary<Schema> {
  return fc
    .integer({ min: 1, max: maxTables })
    .chain((n) => fc.tuple(...TABLE_NAMES.slice(0, n).map(tableArb)))
    .map((tables) => ({ tables }));
}

/** Up to `max` first rows of `table`, with distinct keys. */
export function firstRows(schema: Schema, table: Table, max: number): fc.Arbitrary<string[][]> {
  return fc
    .uniqueArray(keyValue(table.key), {
      maxLength: max,
      comparator: (x, y) => sameKey(table.key, x, y),
    })
    .chain((keys) => fc.tuple(...keys.map((k) => rowValues(schema, table, k))));
}

export function databaseArb(maxTables = 3, maxRows = 8): fc.Arbitrary<Database> {
  return schemaArb(maxTables).chain((schema) =>
    fc
      .tuple(...schema.tables.map((t) => firstRows(schema, t, maxRows)))
      .map((rows) => ({ schema, rows })),
  );
}

/** DDL and first rows of a database, tables named with `prefix`. */
export function databaseSql(db: Database, prefix: string): string {
  return db.schema.tables
    .map((t, i) => {
      const cols = columnsOf(db.schema, t);
      const keys = keyColumns(t).map((k) => k.name);
      const ddl = `CREATE TABLE ${physical(prefix, t.name)} (${cols
        .map((c) => `${c.name} ${SQL_TYPE[c.type]}${c.notNull ? ' NOT NULL' : ''}`)
        .join(', ')}, PRIMARY KEY (${keys.join(', ')}));`;
      const rows = db.rows[i] ?? [];
      const insert = rows.length
        ? `\nINSERT INTO ${physical(prefix, t.name)} VALUES ${rows.map((r) => `(${r.join(', ')})`).join(', ')};`
        : '';
      return ddl + insert;
    })
    .join('\n');
}
