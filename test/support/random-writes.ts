import fc from 'fast-check';
import {
  type Column,
  columnsOf,
  keyColumns,
  keyValue,
  refColumns,
  refValue,
  rowValues,
  type Schema,
  sameKey,
  type Table,
} from './random-schema.js';
import { type ColumnType, value } from './random-values.js';
import type { SavepointStep, Step } from './workload.js';

/**
 * Random concurrent writes to a random schema (random-schema.ts), for the differential
 * tests: each writer a list of steps (a statement, a transaction that commits or rolls
 * back, often with a savepoint rolled back inside, a TRUNCATE), as fast-check values, so a
 * failing run shrinks to the writes that matter. Statements name tables as `«a»`, replaced
 * by the case's physical names when it runs (`placeTables`).
 *
 * What they do: single and multi-row inserts, upserts, updates of values, of references
 * (rows move between joins), of keys (to free keys or onto taken ones: a unique violation,
 * expected), updates that change only a value's image (case, numeric scale, the sign of
 * zero), deletes, a delete and re-insert of one key, updates and deletes of many rows.
 * Writers share the keys of a few keys' pool, so they collide (unique violations,
 * deadlocks: both expected, see workload.ts).
 */

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
  };
  return images[c.type];
}

function predicateOn(c: Column): fc.Arbitrary<string> {
  return fc.constantFrom(`${c.name} IS NULL`, `${c.name} IS NOT NULL`, 'true');
}

/** One statement on `table`. */
function statementArb(schema: Schema, table: Table): fc.Arbitrary<string> {
  const t = tableRef(table);
  const keys = keyColumns(table);
  const settable = columnsOf(schema, table).filter((c) => !keys.some((k) => k.name === c.name));
  const others = schema.tables.filter((o) => o !== table);
  const row = (key: string[]) => rowValues(schema, table, key).map((r) => `(${r.join(', ')})`);
  const keyArb = keyValue(table.key);
  // Values for data columns; references draw from the referenced table's keys (below).
  const setArb = fc
    .constantFrom(...table.data)
    .chain((c) => value(c.type, !c.notNull).map((v) => `${c.name} = ${v}`));
  const statements: Array<fc.Arbitrary<string>> = [
    keyArb.chain(row).map((r) => `INSERT INTO ${t} VALUES ${r}`),
    fc
      .uniqueArray(keyArb, {
        minLength: 2,
        maxLength: 3,
        comparator: (x, y) => sameKey(table.key, x, y),
      })
      .chain((ks) => fc.tuple(...ks.map(row)))
      .map((rs) => `INSERT INTO ${t} VALUES ${rs.join(', ')}`),
    fc
      .tuple(keyArb.chain(row), fc.subarray(settable, { minLength: 1 }), fc.boolean())
      .map(
        ([r, cols, nothing]) =>
          `INSERT INTO ${t} VALUES ${r} ON CONFLICT (${keys.map((k) => k.name).join(', ')}) ${
            nothing
              ? 'DO NOTHING'
              : `DO UPDATE SET ${cols.map((c) => `${c.name} = EXCLUDED.${c.name}`).join(', ')}`
          }`,
      ),
    fc
      .tuple(setArb, keyArb)
      .map(([set, k]) => `UPDATE ${t} SET ${set} WHERE ${keyWhere(table, k)}`),
    fc
      .tuple(setArb, fc.constantFrom(...settable).chain(predicateOn))
      .map(([set, where]) => `UPDATE ${t} SET ${set} WHERE ${where}`),
    fc
      .tuple(fc.constantFrom(...settable), fc.option(keyArb))
      .map(
        ([c, k]) =>
          `UPDATE ${t} SET ${c.name} = ${imageChange(c)}${k ? ` WHERE ${keyWhere(table, k)}` : ''}`,
      ),
    // Key changes: to a key that may be free or taken, and (under ci) only in case.
    fc.tuple(keyArb, keyArb, fc.nat(keys.length - 1)).map(([from, to, n]) => {
      const k = keys[n]!;
      return `UPDATE ${t} SET ${k.name} = ${to[n]} WHERE ${keyWhere(table, from)}`;
    }),
    fc.tuple(keyArb, fc.boolean()).map(([k, all]) => {
      const c = keys.find((x) => x.type !== 'int') ?? keys[0]!;
      const change = c.type === 'int' ? `${c.name} + 100` : `upper(${c.name})`;
      return `UPDATE ${t} SET ${c.name} = ${change}${all ? '' : ` WHERE ${keyWhere(table, k)}`}`;
    }),
    keyArb.map((k) => `DELETE FROM ${t} WHERE ${keyWhere(table, k)}`),
    fc
      .constantFrom(...settable)
      .chain((c) => predicateOn(c).map((w) => `DELETE FROM ${t} WHERE ${w}`)),
  ];
  if (others.length > 0) {
    // References: rows move between join partners, or lose them.
    statements.push(
      fc.tuple(fc.constantFrom(...others), fc.option(keyArb, { freq: 3 })).chain(([other, k]) =>
        refValue(other).map((ref) => {
          const set = refColumns(other)
            .map((c, i) => `${c.name} = ${ref[i]}`)
            .join(', ');
          return `UPDATE ${t} SET ${set}${k ? ` WHERE ${keyWhere(table, k)}` : ''}`;
        }),
      ),
    );
  }
  return fc.oneof(...statements);
}

function anyStatementArb(schema: Schema): fc.Arbitrary<string> {
  return fc.oneof(...schema.tables.map((t) => statementArb(schema, t)));
}

/** A key deleted and inserted again (maybe with other values), in one transaction. */
function reinsertArb(schema: Schema): fc.Arbitrary<Step> {
  return fc.constantFrom(...schema.tables).chain((table) =>
    keyValue(table.key).chain((k) =>
      rowValues(schema, table, k).map(
        (r): Step => ({
          kind: 'transaction',
          body: [
            `DELETE FROM ${tableRef(table)} WHERE ${keyWhere(table, k)}`,
            `INSERT INTO ${tableRef(table)} VALUES (${r.join(', ')})`,
          ],
          rollback: false,
          holdMs: 0,
        }),
      ),
    ),
  );
}

function stepArb(schema: Schema): fc.Arbitrary<Step> {
  const statement = anyStatementArb(schema);
  const savepoint: fc.Arbitrary<SavepointStep> = fc.record({
    savepoint: fc.array(statement, { minLength: 1, maxLength: 2 }),
    rollback: fc.boolean(),
  });
  return fc.oneof(
    { weight: 12, arbitrary: statement.map((sql): Step => ({ kind: 'statement', sql })) },
    {
      weight: 5,
      arbitrary: fc
        .record({
          body: fc.array(statement, { minLength: 1, maxLength: 3 }),
          savepoint: fc.option(savepoint, { freq: 2 }),
          rollback: fc.boolean(),
          // Now and then held open across ticks while the other writers commit.
          holdMs: fc.constantFrom(0, 0, 0, 120),
        })
        .map(
          ({ body, savepoint, rollback, holdMs }): Step => ({
            kind: 'transaction',
            body: savepoint ? [...body, savepoint] : body,
            rollback,
            holdMs,
          }),
        ),
    },
    { weight: 2, arbitrary: reinsertArb(schema) },
    {
      weight: 1,
      arbitrary: fc
        .constantFrom(...schema.tables)
        .map((t): Step => ({ kind: 'truncate', sql: `TRUNCATE ${tableRef(t)}` })),
    },
  );
}

/** Concurrent writers' steps. */
export function writersArb(
  schema: Schema,
  sizes: { writers: number; steps: number },
): fc.Arbitrary<Step[][]> {
  return fc.array(fc.array(stepArb(schema), { maxLength: sizes.steps }), {
    minLength: 1,
    maxLength: sizes.writers,
  });
}

/** A step's statements as one text (for printing a case). */
export function stepText(step: Step): string {
  if (step.kind !== 'transaction') return `${step.sql};`;
  const body = step.body.map((part) =>
    typeof part === 'string'
      ? `${part};`
      : `SAVEPOINT s; ${part.savepoint.map((s) => `${s};`).join(' ')} ${part.rollback ? 'ROLLBACK TO SAVEPOINT s' : 'RELEASE SAVEPOINT s'};`,
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
