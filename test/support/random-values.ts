/**
 * Column types of the differential tests' random schemas, and SQL literals of each,
 * weighted towards the values that tell value images apart (ENGINE.md, capture): NULL,
 * numeric scales (1.0 and 1.00), -0, NaN and infinities, text differing only in case
 * (under citext and the case-insensitive collation `ci`), long text, jsonb whose numbers
 * differ only in scale; timestamps with fractions and infinities, uuids spelled in other
 * ways, int arrays (empty, with a NULL).
 *
 * Floats are dyadic fractions (0.5, -2.25...): their sums are exact whatever the order
 * rows are added in, so an aggregate's value does not depend on it (sums of 0.1s could
 * cancel to 1e-17 in one order and to 0 in another, beyond any relative tolerance).
 */
export type ColumnType =
  | 'int'
  | 'bigint'
  | 'numeric'
  | 'numeric_2'
  | 'float8'
  | 'text'
  | 'citext'
  | 'text_ci'
  | 'boolean'
  | 'date'
  | 'jsonb'
  | 'timestamp'
  | 'uuid'
  | 'int_array';

export const COLUMN_TYPES: readonly ColumnType[] = [
  'int',
  'bigint',
  'numeric',
  'numeric_2',
  'float8',
  'text',
  'citext',
  'text_ci',
  'boolean',
  'date',
  'jsonb',
  'timestamp',
  'uuid',
  'int_array',
];

/** The type as written in DDL (`ci` is the database's case-insensitive ICU collation). */
export const SQL_TYPE: Record<ColumnType, string> = {
  int: 'int',
  bigint: 'bigint',
  numeric: 'numeric',
  numeric_2: 'numeric(12,2)',
  float8: 'float8',
  text: 'text',
  citext: 'citext',
  text_ci: 'text COLLATE ci',
  boolean: 'boolean',
  date: 'date',
  jsonb: 'jsonb',
  timestamp: 'timestamp',
  uuid: 'uuid',
  int_array: 'int[]',
};

/** What a random database needs besides its tables. */
export const VALUE_TYPES_SETUP = `
  CREATE EXTENSION IF NOT EXISTS citext;
  CREATE COLLATION IF NOT EXISTS ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);`;

const strings = [
  "''",
  "'a'",
  "'A'",
  "'abc'",
  "'ABC'",
  "'Abc'",
  "'b'",
  "'zz'",
  "'Straße'",
  "'STRASSE'",
  "'é'",
  "'É'",
  "' x '",
  "'it''s'",
  "'NULL'",
  // Long enough to be stored out of line (TOAST), and differing only in case.
  "repeat('ab', 3000)",
  "repeat('AB', 3000)",
];

const LITERALS: Record<ColumnType, readonly string[]> = {
  int: ['0', '1', '-1', '2', '3', '7', '42', '-100', '1000'],
  bigint: ['0', '1', '-1', '5', '4000000000', '-4000000000', '1000000000000000'],
  numeric: [
    '1',
    '1.0',
    '1.00',
    '0',
    '0.0',
    '-0.0',
    '2.5',
    '2.50',
    '-7.125',
    '12.345',
    '1e3',
    "'NaN'",
    '123456789.123456789',
  ],
  numeric_2: ['1', '1.0', '1.005', '0', '-0.5', '2.50', '99999.99'],
  float8: [
    '0',
    "'-0'",
    '0.5',
    '1.5',
    '-2.25',
    '0.125',
    '1024.75',
    "'NaN'",
    "'Infinity'",
    "'-Infinity'",
  ],
  text: strings,
  citext: strings,
  text_ci: strings,
  boolean: ['true', 'false'],
  date: [
    "'2024-01-01'",
    "'2024-02-29'",
    "'1999-12-31'",
    "'0001-01-01'",
    "'infinity'",
    "'-infinity'",
  ],
  jsonb: [
    `'{"k": 1.0}'`,
    `'{"k": 1.00}'`,
    `'{"k": 1}'`,
    `'{"k": "A"}'`,
    `'{"k": "a"}'`,
    `'{"k": null}'`,
    `'{}'`,
    `'[1, 2]'`,
    `'null'`,
    `'"str"'`,
  ],
  timestamp: [
    "'2024-01-01 10:00:00'",
    "'2024-01-01 10:00:00.5'",
    "'2024-02-29 00:00:00'",
    "'1999-12-31 23:59:59.999999'",
    "'infinity'",
    "'-infinity'",
  ],
  // The same value in other spellings (capitals, braces): uuid has one image, whatever the input.
  uuid: [
    "'00000000-0000-0000-0000-000000000000'",
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
    "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
    "'{b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12}'",
    "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
  ],
  int_array: ["'{}'", "'{1}'", "'{1,2}'", "'{2,1}'", "'{1,NULL}'", "'{3,4,5}'"],
};

/**
 * The `n`th value of a column of `type` (taken modulo how many there are): NULL first when
 * the column takes it (and again last, so about one value in eight is NULL), then its
 * literals. A choice shrinks towards 0: NULL, or the type's plainest literal.
 */
export function valueAt(type: ColumnType, nullable: boolean, n: number): string {
  const literals = LITERALS[type];
  const values = nullable ? ['NULL', ...literals, 'NULL'] : literals;
  return values[n % values.length]!;
}

/** A constant to compare a column of `type` with (in WHERE, ON, FILTER, HAVING). */
export function comparand(type: ColumnType): string {
  switch (type) {
    case 'int':
    case 'bigint':
      return '1';
    case 'numeric':
    case 'numeric_2':
      return '1.0';
    case 'float8':
      return '0';
    case 'date':
      return "'2000-01-01'";
    case 'boolean':
      return 'true';
    case 'jsonb':
      return `'{"k": 1}'`;
    case 'timestamp':
      return "'2000-01-01 00:00:00'";
    case 'uuid':
      return "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'";
    case 'int_array':
      return "'{1}'";
    default:
      return "'b'";
  }
}
