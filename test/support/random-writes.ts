import fc from 'fast-check';
import {
  type Column,
  cellArb,
  columnsOf,
  keyAt,
  keyColumns,
  othersOf,
  type RowChoice,
  refAt,
  refColumns,
  rowChoiceArb,
  rowLiterals,
  type Schema,
  sameKey,
  type Table,
} from './random-schema.js';
import { type ColumnType, SQL_TYPE, valueAt } from './random-values.js';
import type { SavepointStep, Step } from './workload.js';

/**
 * Random concurrent writes to a random schema (random-schema.ts), for the differential
 * tests: each writer a list of steps (a statement, a transaction that commits or rolls
 * back, often with a savepoint rolled back inside, a key deleted and inserted again, a
 * TRUNCATE). Steps are generated as choices (numbers read modulo the schema's tables,
 * keys, columns and values: see `readSteps`), so a failing case shrinks to the writes
 * that matter and every write still means something when its schema shrinks. Statements
 * name tables as `«a»`, replaced by the case's physical names when it runs.
 *
 * What they do: single and multi-row inserts, upserts, updates of values, of references
 * (rows move between joins), of keys (to free keys or onto taken ones: a unique violation,
 * expected), updates that change only a value's image (case, numeric scale, the sign of
 * zero), deletes, updates and deletes of many rows. Writers share a few keys, so they
 * collide (unique violations and deadlocks, both expected: see workload.ts).
 */

/** A statement as generated: which table, which kind of statement, and what it picks. */
export interface StatementChoice {
  table: number;
  kind: number;
  /** Picks (keys, columns, values...), each read modulo what there is. */
  a: number;
  b: number;
  c: number;
  flag: boolean;
  rows: RowChoice[];
  /**
   * 0 (most of the time): one of the statements above, by `kind`; 1: the rows loaded by
   * `COPY … FROM STDIN`; 2: a `MERGE` of the rows (MERGE needs Postgres 15).
   */
  form: number;
}

export type StepChoice =
  | { kind: 'statement'; statement: StatementChoice }
  | {
      kind: 'transaction';
      body: StatementChoice[];
      savepoint: { statements: StatementChoice[]; rollback: boolean } | null;
      rollback: boolean;
    }
  | {
      /**
       * A transaction held open between its statements while the other writers commit, so
       * ticks are taken while it is in progress (a drain must read its changes in the range
       * it commits in, not the one it began in). Each statement in a savepoint of its own:
       * an error the writers cause each other rolls back that statement alone.
       */
      kind: 'held';
      statements: StatementChoice[];
    }
  | { kind: 'reinsert'; table: number; row: RowChoice }
  | { kind: 'truncate'; table: number };

/** How long a held transaction waits between its statements: a few of the 50 ms ticks. */
const HOLD_MS = 200;

const tableRef = (t: Table) => `«${t.name}»`;

/** Replaces `«a»` with each table's physical name. */
export function placeTables(sql: string, physical: (name: string) => string): string {
  return sql.replace(/«(\w+)»/g, (_, name: string) => physical(name));
}

function keyWhere(table: Table, key: string[]): string {
  return keyColumns(table)
    .map((k, i) => `${k.name} = ${key[i]}`)
    .join(' AND ');
}

/** An update that changes only a value's image (or, for types without variants, its value). */
function imageChange(c: Column): string {
  const images: Record<ColumnType, string> = {
    int: `${c.name} + 1`,
    bigint: `${c.name} + 1`,
    numeric: `${c.name} * 1.0`,
    numeric_2: `${c.name} + 1`,
    float8: `- ${c.name}`,
    text: `upper(${c.name})`,
    citext: `upper(${c.name})`,
    text_ci: `lower(${c.name})`,
    boolean: `NOT ${c.name}`,
    date: `${c.name} + 1`,
    jsonb: `CASE WHEN jsonb_typeof(${c.name}) = 'object' THEN ${c.name} || '{"k": 1.00}' ELSE ${c.name} END`,
    timestamp: `${c.name} + interval '1 hour'`,
    // (NULL only where the column takes one: a NOT NULL column gets another value.)
    uuid: `CASE WHEN ${c.name} = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11' THEN ${c.notNull ? `'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid` : 'NULL'} ELSE 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::uuid END`,
    int_array: `${c.name} || 1`,
  };
  return images[c.type];
}

function at<T>(items: readonly T[], n: number): T {
  return items[n % items.length]!;
}

const ROW_FILTERS = [
  (c: string) => `${c} IS NULL`,
  (c: string) => `${c} IS NOT NULL`,
  () => 'true',
];

/**
 * A value's SQL literal (as `valueAt` writes them) as COPY's text format writes it: `\N`
 * for NULL, a string without its quotes, `repeat('ab', 3000)` spelled out.
 */
export function copyValue(literal: string): string {
  if (literal === 'NULL') return '\\N';
  const repeat = /^repeat\('(\w+)', (\d+)\)$/.exec(literal);
  if (repeat) return repeat[1]!.repeat(Number(repeat[2]));
  const quoted = /^'([\s\S]*)'$/.exec(literal);
  const text = quoted ? quoted[1]!.replaceAll("''", "'") : literal;
  return text.replaceAll('\\', '\\\\').replaceAll('\t', '\\t').replaceAll('\n', '\\n');
}

/** Rows of distinct keys (one statement cannot insert, or MERGE, a key twice). */
function distinctRows(table: Table, rows: RowChoice[]): RowChoice[] {
  const seen: string[][] = [];
  return rows.filter((r) => {
    const key = keyAt(table.key, r.key);
    if (seen.some((k) => sameKey(table.key, k, key))) return false;
    seen.push(key);
    return true;
  });
}

/** Rows loaded with `COPY … FROM STDIN`: the statement, its data lines, `\.`. */
function copyStatement(schema: Schema, table: Table, rows: RowChoice[]): string {
  const columns = columnsOf(schema, table).map((c) => c.name);
  const lines = distinctRows(table, rows).map(
    (r) =>
      `${rowLiterals(schema, table, keyAt(table.key, r.key), r.cells).map(copyValue).join('\t')}\n`,
  );
  return `COPY ${tableRef(table)} (${columns.join(', ')}) FROM STDIN;\n${lines.join('')}\\.`;
}

/**
 * A MERGE of rows into the table: matched rows updated (some columns, maybe only under a
 * condition) or deleted, unmatched ones inserted or left out.
 */
function mergeStatement(schema: Schema, table: Table, s: StatementChoice): string {
  const columns = columnsOf(schema, table);
  const keys = keyColumns(table);
  const settable = columns.slice(keys.length);
  const rows = distinctRows(table, s.rows).map(
    (r) =>
      `(${rowLiterals(schema, table, keyAt(table.key, r.key), r.cells)
        .map((v, i) => `(${v})::${SQL_TYPE[columns[i]!.type]}`)
        .join(', ')})`,
  );
  const on = keys.map((k) => `m.${k.name} = v.${k.name}`).join(' AND ');
  const update = settable.filter((_, i) => ((s.b >> i) & 1) === 1);
  const sets = (update.length ? update : [at(settable, s.b)])
    .map((c) => `${c.name} = v.${c.name}`)
    .join(', ');
  const condition = at(ROW_FILTERS, s.c)(`m.${at(settable, s.c >> 2).name}`);
  const matched = [
    `WHEN MATCHED AND ${condition} THEN UPDATE SET ${sets}`,
    `WHEN MATCHED THEN ${s.a % 3 === 1 ? 'DELETE' : `UPDATE SET ${sets}`}`,
  ].slice(s.a % 2);
  const notMatched = s.flag
    ? []
    : [
        `WHEN NOT MATCHED THEN INSERT (${columns.map((c) => c.name).join(', ')}) VALUES (${columns
          .map((c) => `v.${c.name}`)
          .join(', ')})`,
      ];
  return [
    `MERGE INTO ${tableRef(table)} AS m USING (VALUES ${rows.join(', ')}) AS v (${columns
      .map((c) => c.name)
      .join(', ')}) ON ${on}`,
    ...matched,
    ...notMatched,
  ].join(' ');
}

/** One statement on one of the schema's tables. */
export function readStatement(schema: Schema, s: StatementChoice): string {
  const table = at(schema.tables, s.table);
  if (s.form % 20 === 1) return copyStatement(schema, table, s.rows);
  if (s.form % 20 === 2) return mergeStatement(schema, table, s);
  const t = tableRef(table);
  const keys = keyColumns(table);
  const settable = columnsOf(schema, table).slice(keys.length);
  const others = othersOf(schema, table);
  const key = (n: number) => keyAt(table.key, n);
  const row = (r: RowChoice) => `(${rowLiterals(schema, table, key(r.key), r.cells).join(', ')})`;
  const first: RowChoice = s.rows[0] ?? { key: 0, cells: [] };
  const filter = (n: number) => at(ROW_FILTERS, n)(at(settable, n >> 2).name);
  const set = (column: number, value: number) => {
    const c = at(table.data, column);
    return `${c.name} = ${valueAt(c.type, !c.notNull, value)}`;
  };
  const statements: Array<() => string> = [
    () => `INSERT INTO ${t} VALUES ${row(first)}`,
    () => {
      // Several rows at once (distinct keys: one statement cannot insert a key twice).
      const rows = distinctRows(table, s.rows);
      return `INSERT INTO ${t} VALUES ${(rows.length ? rows : [first]).map(row).join(', ')}`;
    },
    () => {
      const columns = settable.filter((_, i) => ((s.a >> i) & 1) === 1);
      const update = columns.length ? columns : [at(settable, s.a)];
      return `INSERT INTO ${t} VALUES ${row(first)} ON CONFLICT (${keys.map((k) => k.name).join(', ')}) ${
        s.flag
          ? 'DO NOTHING'
          : `DO UPDATE SET ${update.map((c) => `${c.name} = EXCLUDED.${c.name}`).join(', ')}`
      }`;
    },
    () => `UPDATE ${t} SET ${set(s.a, s.b)} WHERE ${keyWhere(table, key(s.c))}`,
    () => `UPDATE ${t} SET ${set(s.a, s.b)} WHERE ${filter(s.c)}`,
    () => {
      const c = at(settable, s.a);
      return `UPDATE ${t} SET ${c.name} = ${imageChange(c)}${s.flag ? '' : ` WHERE ${keyWhere(table, key(s.b))}`}`;
    },
    // Key changes: to a key that may be free or taken, and (under ci) only in case.
    () => {
      const n = s.c % keys.length;
      return `UPDATE ${t} SET ${keys[n]!.name} = ${key(s.b)[n]} WHERE ${keyWhere(table, key(s.a))}`;
    },
    () => {
      const c = keys.find((x) => x.type !== 'int') ?? keys[0]!;
      const change = c.type === 'int' ? `${c.name} + 100` : `upper(${c.name})`;
      return `UPDATE ${t} SET ${c.name} = ${change}${s.flag ? '' : ` WHERE ${keyWhere(table, key(s.a))}`}`;
    },
    () => `DELETE FROM ${t} WHERE ${keyWhere(table, key(s.a))}`,
    () => `DELETE FROM ${t} WHERE ${filter(s.a)}`,
    // References: rows move between join partners, or lose them.
    ...(others.length
      ? [
          () => {
            const other = at(others, s.a);
            const ref = refAt(other, s.b);
            const sets = refColumns(other)
              .map((c, i) => `${c.name} = ${ref[i]}`)
              .join(', ');
            return `UPDATE ${t} SET ${sets}${s.flag ? '' : ` WHERE ${keyWhere(table, key(s.c))}`}`;
          },
        ]
      : []),
  ];
  return at(statements, s.kind)();
}

/** A writer's steps, read against the schema. */
export function readSteps(schema: Schema, steps: StepChoice[]): Step[] {
  const statement = (s: StatementChoice) => readStatement(schema, s);
  return steps.map((step): Step => {
    switch (step.kind) {
      case 'statement':
        return { kind: 'statement', sql: statement(step.statement) };
      case 'transaction': {
        const body: Array<string | SavepointStep> = step.body.map(statement);
        if (step.savepoint) {
          body.push({
            savepoint: step.savepoint.statements.map(statement),
            rollback: step.savepoint.rollback,
          });
        }
        return {
          kind: 'transaction',
          body,
          rollback: step.rollback,
          holdMs: 0,
        };
      }
      case 'held':
        return {
          kind: 'transaction',
          body: step.statements.map((x) => ({ savepoint: [statement(x)], rollback: false })),
          rollback: false,
          holdMs: HOLD_MS,
        };
      case 'reinsert': {
        // A key deleted and inserted again (maybe with other values), in one transaction.
        const table = at(schema.tables, step.table);
        const key = keyAt(table.key, step.row.key);
        return {
          kind: 'transaction',
          body: [
            `DELETE FROM ${tableRef(table)} WHERE ${keyWhere(table, key)}`,
            `INSERT INTO ${tableRef(table)} VALUES (${rowLiterals(schema, table, key, step.row.cells).join(', ')})`,
          ],
          rollback: false,
          holdMs: 0,
        };
      }
      default:
        return { kind: 'truncate', sql: `TRUNCATE ${tableRef(at(schema.tables, step.table))}` };
    }
  });
}

const statementChoiceArb: fc.Arbitrary<StatementChoice> = fc.record({
  table: fc.nat(2),
  kind: fc.noBias(fc.nat(10)),
  a: cellArb,
  b: cellArb,
  c: cellArb,
  flag: fc.boolean(),
  rows: fc.array(rowChoiceArb, { minLength: 1, maxLength: 3 }),
  // Shrinks to 0, an ordinary statement; a COPY or a MERGE one time in ten.
  form: fc.nat(19),
});

const stepChoiceArb: fc.Arbitrary<StepChoice> = fc.oneof(
  // A failing transaction shrinks to a plain statement where it can.
  { withCrossShrink: true },
  {
    weight: 60,
    arbitrary: fc.record({
      kind: fc.constant('statement' as const),
      statement: statementChoiceArb,
    }),
  },
  {
    weight: 25,
    arbitrary: fc.record({
      kind: fc.constant('transaction' as const),
      body: fc.array(statementChoiceArb, { minLength: 1, maxLength: 3 }),
      savepoint: fc.option(
        fc.record({
          statements: fc.array(statementChoiceArb, { minLength: 1, maxLength: 2 }),
          rollback: fc.boolean(),
        }),
        { freq: 2 },
      ),
      rollback: fc.boolean(),
    }),
  },
  {
    weight: 8,
    arbitrary: fc.record({
      kind: fc.constant('held' as const),
      statements: fc.array(statementChoiceArb, { minLength: 2, maxLength: 4 }),
    }),
  },
  {
    weight: 10,
    arbitrary: fc.record({
      kind: fc.constant('reinsert' as const),
      table: fc.nat(2),
      row: rowChoiceArb,
    }),
  },
  // Rare (one step in a hundred): a TRUNCATE rebuilds the targets reading the table, which
  // would hide what the drain did to them before it.
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('truncate' as const), table: fc.nat(2) }) },
);

/** Concurrent writers' steps, as choices. */
export function writersArb(sizes: {
  writers: number;
  steps: number;
}): fc.Arbitrary<StepChoice[][]> {
  return fc.array(fc.array(stepChoiceArb, { maxLength: sizes.steps }), {
    minLength: 1,
    maxLength: sizes.writers,
  });
}

/** A statement as psql takes it: `;` after it, or nothing after a COPY's `\.` (then a line). */
function terminated(statement: string): string {
  return statement.endsWith('\\.') ? `${statement}\n` : `${statement};`;
}

/** A step's statements as one text (for printing a case). */
export function stepText(step: Step): string {
  if (step.kind !== 'transaction') return terminated(step.sql);
  const body = step.body.map((part) =>
    typeof part === 'string'
      ? terminated(part)
      : `SAVEPOINT s; ${part.savepoint.map(terminated).join(' ')} ${part.rollback ? 'ROLLBACK TO SAVEPOINT s' : 'RELEASE SAVEPOINT s'};`,
  );
  const hold = step.holdMs > 0 ? ` -- held open ${step.holdMs} ms between statements` : '';
  return `BEGIN; ${body.join(' ')} ${step.rollback ? 'ROLLBACK' : 'COMMIT'};${hold}`;
}

/** A writer's steps with the tables named. */
export function placeSteps(steps: Step[], physical: (name: string) => string): Step[] {
  return steps.map((step): Step => {
    if (step.kind !== 'transaction') return { ...step, sql: placeTables(step.sql, physical) };
    return {
      ...step,
      body: step.body.map((part) =>
        typeof part === 'string'
          ? placeTables(part, physical)
          : { ...part, savepoint: part.savepoint.map((s) => placeTables(s, physical)) },
      ),
    };
  });
}

/**
 * Source DDL the engine follows (README, Changing a transform; ADR 0047), run once every
 * target is live, before the live writers: a column added (nothing reads it), an index
 * created, a column added and dropped (a dropped attribute in the rows written after), an
 * int column retyped to bigint or a numeric(12,2) one to numeric, a column renamed (read or not: the engine rewrites the
 * statements reading it, and renames a target column named after it).
 */
export interface DdlChoice {
  kind: number;
  table: number;
  column: number;
}

export const ddlChoicesArb: fc.Arbitrary<DdlChoice[]> = fc.array(
  fc.record({ kind: fc.nat(4), table: fc.nat(2), column: fc.nat(5) }),
  { minLength: 1, maxLength: 3 },
);

/** What a case's DDL is: its statements, and the schema as the live writers see it after. */
export interface Ddl {
  statements: string[];
  /** What it does, by name (`ADD COLUMN`...), for the generator's coverage. */
  constructs: string[];
  after: Schema;
}

/** The DDL a choice stands for, read against the schema (statements name tables `«a»`). */
export function readDdl(schema: Schema, choices: DdlChoice[]): Ddl {
  let after = schema;
  const statements: string[] = [];
  const constructs: string[] = [];
  const retyped = new Set<string>();
  choices.forEach((d, i) => {
    const index = d.table % after.tables.length;
    const table = after.tables[index]!;
    const t = tableRef(table);
    const column = at(table.data, d.column);
    switch (d.kind % 5) {
      case 0:
        statements.push(`ALTER TABLE ${t} ADD COLUMN added${i + 1} int DEFAULT 7`);
        constructs.push('DDL: ADD COLUMN');
        return;
      case 1:
        statements.push(`CREATE INDEX ON ${t} (${column.name})`);
        constructs.push('DDL: CREATE INDEX');
        return;
      case 2:
        statements.push(
          `ALTER TABLE ${t} ADD COLUMN gone${i + 1} text`,
          `ALTER TABLE ${t} DROP COLUMN gone${i + 1}`,
        );
        constructs.push('DDL: DROP COLUMN');
        return;
      case 3: {
        // An int column, read or not, to bigint, or a numeric(12,2) one to numeric: every
        // generated expression still holds.
        const widens = table.data.filter(
          (c) => (c.type === 'int' || c.type === 'numeric_2') && !retyped.has(`${index}.${c.name}`),
        );
        if (widens.length === 0) return;
        const widen = at(widens, d.column);
        retyped.add(`${index}.${widen.name}`);
        const to = widen.type === 'int' ? 'bigint' : 'numeric';
        statements.push(`ALTER TABLE ${t} ALTER COLUMN ${widen.name} TYPE ${to}`);
        constructs.push(`DDL: ${SQL_TYPE[widen.type]} to ${to}`);
        return;
      }
      default: {
        if (column.name.endsWith('_r')) return;
        const renamed = `${column.name}_r`;
        statements.push(`ALTER TABLE ${t} RENAME COLUMN ${column.name} TO ${renamed}`);
        constructs.push('DDL: RENAME COLUMN');
        after = {
          ...after,
          tables: after.tables.map((x, n) =>
            n === index
              ? { ...x, data: x.data.map((c) => (c === column ? { ...c, name: renamed } : c)) }
              : x,
          ),
        };
      }
    }
  });
  return { statements, constructs, after };
}
