import fc from 'fast-check';
import { COLUMN_TYPES, type ColumnType, SQL_TYPE, valueAt } from './random-values.js';

/**
 * Random schemas for the differential tests: one to three tables (logical names a, b, c),
 * each with a primary key (int, text, text under the case-insensitive collation, or two
 * columns), one to four columns of assorted types (nullable or not), and, for every other
 * table, columns holding that table's key (nullable: `to_b`, or `to_b1`, `to_b2` for a
 * two-column key), through which the tables join. Plus the rows each starts with.
 *
 * Everything is generated as choices (natural numbers read modulo what there is) and read
 * against the schema afterwards, never with `chain`: when fast-check shrinks a case (drops
 * a table, a column, a row) every other part of it keeps its meaning, instead of being
 * generated afresh as a different case.
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
  /**
   * How its tables are named in SQL: `d17_a`; quoted, `"d17 A"`; or in a schema of their
   * own whose name needs quoting, `"Src d17".d17_a` (targets are named plainly).
   */
  naming: Naming;
}

export type Naming = 'plain' | 'quoted' | 'schema';

/** A table as generated: its key's kind and its data columns' types, unnamed. */
export interface TableChoice {
  key: KeyKind;
  data: Array<{ type: ColumnType; notNull: boolean }>;
}

/**
 * A row as generated: which key of the table's pool, and a choice per cell (each data
 * column, then each reference, in `columnsOf` order); missing cells read as 0.
 */
export interface RowChoice {
  key: number;
  cells: number[];
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

/** The other tables, whose keys `table` holds references to (in table order). */
export function othersOf(schema: Schema, table: Table): Table[] {
  return schema.tables.filter((t) => t !== table);
}

/** Every column of `table`, in table order: key, data, references. */
export function columnsOf(schema: Schema, table: Table): Column[] {
  return [
    ...keyColumns(table),
    ...table.data,
    ...othersOf(schema, table).flatMap((other) => refColumns(other)),
  ];
}

/** The schema a case's tables are in, when `naming` is `schema` (as stored: unquoted). */
export function caseSchema(prefix: string): string {
  return `Src ${prefix}`;
}

/** A logical table's name in SQL, in a case with prefix `prefix` and tables named so. */
export function tableSql(prefix: string, name: string, naming: Naming): string {
  switch (naming) {
    case 'plain':
      return physical(prefix, name);
    case 'quoted':
      return `"${prefix} ${name.toUpperCase()}"`;
    case 'schema':
      return `"${caseSchema(prefix)}".${physical(prefix, name)}`;
  }
}

/** A table's name as Postgres stores it (unquoted), with its schema unless it is in `public`. */
export function tableStored(prefix: string, name: string, naming: Naming): string {
  switch (naming) {
    case 'plain':
      return physical(prefix, name);
    case 'quoted':
      return `${prefix} ${name.toUpperCase()}`;
    case 'schema':
      return `${caseSchema(prefix)}.${physical(prefix, name)}`;
  }
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

/** The `n`th key (modulo the pool) of a table of kind `kind`, as its columns' literals. */
export function keyAt(kind: KeyKind, n: number): string[] {
  const pool = KEY_POOLS[kind];
  return pool[n % pool.length]!;
}

/** Two keys are the same row's under the key's equality (case-blind under ci). */
export function sameKey(kind: KeyKind, x: string[], y: string[]): boolean {
  const norm = (k: string[]) => (kind === 'text_ci' ? k.map((v) => v.toLowerCase()) : k);
  return JSON.stringify(norm(x)) === JSON.stringify(norm(y));
}

/** The `n`th reference to `other`: NULL first (and last), then its keys (present or not). */
export function refAt(other: Table, n: number): string[] {
  const nulls = keyColumns(other).map(() => 'NULL');
  const values = [nulls, ...KEY_POOLS[other.key], nulls];
  return values[n % values.length]!;
}

/** How many cells a row of `table` has: one per data column, one per reference. */
export function cellCount(schema: Schema, table: Table): number {
  return table.data.length + othersOf(schema, table).length;
}

/** A whole row of `table`, as literals in `columnsOf` order, with the key given. */
export function rowLiterals(
  schema: Schema,
  table: Table,
  key: string[],
  cells: number[],
): string[] {
  const cell = (i: number) => cells[i] ?? 0;
  const data = table.data.map((c, i) => valueAt(c.type, !c.notNull, cell(i)));
  const refs = othersOf(schema, table).flatMap((o, j) => refAt(o, cell(table.data.length + j)));
  return [...key, ...data, ...refs];
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
  timestamp: 'ts',
  uuid: 'u',
  int_array: 'arr',
};

/** The schema a choice stands for: tables named a, b, c, columns after their types. */
export function readSchema(tables: TableChoice[], naming: Naming = 'plain'): Schema {
  return {
    naming,
    tables: tables.slice(0, TABLE_NAMES.length).map((t, i) => ({
      name: TABLE_NAMES[i]!,
      key: t.key,
      data: t.data.map((c, n) => ({ name: `${COLUMN_PREFIX[c.type]}${n + 1}`, ...c })),
    })),
  };
}

/** The first rows of each table: keys read from the choices, a repeated key's row dropped. */
export function readRows(schema: Schema, rows: RowChoice[][]): string[][][] {
  return schema.tables.map((table, i) => {
    const keys: string[][] = [];
    const read: string[][] = [];
    for (const row of rows[i] ?? []) {
      const key = keyAt(table.key, row.key);
      if (keys.some((k) => sameKey(table.key, k, key))) continue;
      keys.push(key);
      read.push(rowLiterals(schema, table, key, row.cells));
    }
    return read;
  });
}

/** Choices for a cell: uniform over a wide range (not biased towards 0), shrinking to 0. */
export const cellArb = fc.noBias(fc.nat(1000));

/** Up to six cells: four data columns and two references at most. */
export const rowChoiceArb: fc.Arbitrary<RowChoice> = fc.record({
  key: cellArb,
  cells: fc.array(cellArb, { minLength: 6, maxLength: 6 }),
});

const tableChoiceArb: fc.Arbitrary<TableChoice> = fc.record({
  key: fc.constantFrom<KeyKind>('int', 'int', 'text', 'text_ci', 'pair'),
  data: fc.array(fc.record({ type: fc.constantFrom(...COLUMN_TYPES), notNull: fc.boolean() }), {
    minLength: 1,
    maxLength: 4,
  }),
});

export function tableChoicesArb(maxTables = 3): fc.Arbitrary<TableChoice[]> {
  return fc.array(tableChoiceArb, { minLength: 1, maxLength: Math.min(maxTables, 3) });
}

/** Each table's first rows (one list per table that may exist). */
export function rowChoicesArb(maxRows = 8): fc.Arbitrary<RowChoice[][]> {
  return fc.array(fc.array(rowChoiceArb, { maxLength: maxRows }), {
    minLength: TABLE_NAMES.length,
    maxLength: TABLE_NAMES.length,
  });
}

/** DDL and first rows of a database, tables named with `prefix`. */
export function databaseSql(db: Database, prefix: string): string {
  const naming = db.schema.naming;
  const table = (name: string) => tableSql(prefix, name, naming);
  const schema = naming === 'schema' ? `CREATE SCHEMA "${caseSchema(prefix)}";\n` : '';
  return (
    schema +
    db.schema.tables
      .map((t, i) => {
        const cols = columnsOf(db.schema, t);
        const keys = keyColumns(t).map((k) => k.name);
        const ddl = `CREATE TABLE ${table(t.name)} (${cols
          .map((c) => `${c.name} ${SQL_TYPE[c.type]}${c.notNull ? ' NOT NULL' : ''}`)
          .join(', ')}, PRIMARY KEY (${keys.join(', ')}));`;
        const rows = db.rows[i] ?? [];
        const insert = rows.length
          ? `\nINSERT INTO ${table(t.name)} VALUES ${rows.map((r) => `(${r.join(', ')})`).join(', ')};`
          : '';
        return ddl + insert;
      })
      .join('\n')
  );
}
