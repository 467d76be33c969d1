import { createHash } from 'node:crypto';
import { quoteIdent } from '../identifiers.js';
import { EPOCH_BITS, GENERATIONS } from '../internal/ledger.js';

/** One captured column of a source, as the UPDATE trigger compares it. */
export interface CapturedColumn {
  name: string;
  /** The type has an `=` operator; otherwise old and new are compared as text. */
  comparable: boolean;
}

/** What capture of one source table needs to know. */
export interface CaptureSpec {
  /** Trellis's catalog schema. */
  schema: string;
  /** The source's id in `<schema>.sources`, written into every ledger row. */
  sourceId: number;
  /** The source table, schema-qualified and quoted. */
  table: string;
  keyColumns: string[];
  keyTypes: string[];
  /** Non-key columns an UPDATE must change to be captured. */
  captured: CapturedColumn[];
}

export type CaptureEvent = 'insert' | 'update' | 'delete' | 'truncate';
export const CAPTURE_EVENTS: readonly CaptureEvent[] = ['insert', 'update', 'delete', 'truncate'];

/**
 * Key types whose text form does not depend on session settings. Keys travel through the
 * ledger as text; any other key type gets its trigger functions pinned to fixed DateStyle,
 * IntervalStyle, float digits and bytea output, so the drain reads back the same value.
 */
const SETTING_FREE_KEY_TYPES = new Set([
  'smallint',
  'integer',
  'bigint',
  'numeric',
  'text',
  'uuid',
  'boolean',
  'name',
  'oid',
  'citext',
]);

function settingFree(type: string): boolean {
  return (
    SETTING_FREE_KEY_TYPES.has(type) ||
    /^(character varying|character|varchar|char|numeric)(\(.*\))?$/.test(type)
  );
}

/**
 * Triggers of one instance are told apart from another instance's on the same table by a
 * suffix derived from the catalog schema (none for the default schema, `trellis`).
 */
export function triggerName(schema: string, event: CaptureEvent): string {
  const suffix =
    schema === 'trellis' ? '' : `_${createHash('sha256').update(schema).digest('hex').slice(0, 8)}`;
  return `trellis_capture_${event}${suffix}`;
}

export function functionName(spec: Pick<CaptureSpec, 'schema' | 'sourceId'>, event: CaptureEvent) {
  return `${quoteIdent(spec.schema)}.${quoteIdent(`capture_${spec.sourceId}_${event}`)}`;
}

function keyArray(spec: CaptureSpec, alias: string): string {
  return `ARRAY[${spec.keyColumns.map((k) => `${alias}.${quoteIdent(k)}::text`).join(', ')}]`;
}

function keyJoin(spec: CaptureSpec, left: string, right: string): string {
  return spec.keyColumns
    .map((k) => `${left}.${quoteIdent(k)} = ${right}.${quoteIdent(k)}`)
    .join(' AND ');
}

/** Several captured columns compared at once (text where a type has no `=`). */
function rowChanged(columns: CapturedColumn[]): string {
  const side = (alias: string) =>
    columns
      .map((c) =>
        c.comparable ? `${alias}.${quoteIdent(c.name)}` : `${alias}.${quoteIdent(c.name)}::text`,
      )
      .join(', ');
  return `(${side('o')}) IS DISTINCT FROM (${side('n')})`;
}

function changed(column: CapturedColumn): string {
  const c = quoteIdent(column.name);
  return column.comparable
    ? `o.${c} IS DISTINCT FROM n.${c}`
    : `o.${c}::text IS DISTINCT FROM n.${c}::text`;
}

/**
 * A key as one text, as the ledger stores it: a one-column key's text form, a wider
 * key's text[] in its text form (decoded by the drain: src/engine/drain/changed-sql.ts).
 */
function encodedKey(spec: CaptureSpec, alias: string): string {
  return spec.keyColumns.length === 1
    ? `${alias}.${quoteIdent(spec.keyColumns[0]!)}::text`
    : `${keyArray(spec, alias)}::text`;
}

/** The changed keys of one triggering statement, as rows of one column `k`. */
function changedKeys(spec: CaptureSpec, event: 'insert' | 'update' | 'delete'): string {
  const first = quoteIdent(spec.keyColumns[0]!);
  switch (event) {
    case 'insert':
      return `SELECT ${encodedKey(spec, 'n')} AS k FROM trellis_new n`;
    case 'delete':
      return `SELECT ${encodedKey(spec, 'o')} AS k FROM trellis_old o`;
    case 'update': {
      // Old and new rows pair up by key, in one full join of the transition tables. A row
      // whose key changed shows up on both sides unpaired: both keys are captured. A pair
      // whose captured columns are all unchanged captures nothing.
      const differs = spec.captured.length
        ? ` OR ${spec.captured.length === 1 ? changed(spec.captured[0]!) : rowChanged(spec.captured)}`
        : '';
      return `SELECT CASE WHEN n.${first} IS NULL THEN ${encodedKey(spec, 'o')} ELSE ${encodedKey(spec, 'n')} END AS k
    FROM trellis_old o FULL JOIN trellis_new n ON ${keyJoin(spec, 'o', 'n')}
   WHERE o.${first} IS NULL OR n.${first} IS NULL${differs}`;
    }
  }
}

/**
 * The ledger INSERT of one generation: one ledger row with every key the statement
 * changed, none when it changed none. One row per statement, not per changed row: a bulk
 * write's ledger cost is then close to its transition table's, and a single-row write's
 * is the same (measured: chunking big statements into rows of 100 keys, by a window or
 * by array slices, cost single-row writes 5-10% and bulk writes more). `x` is the
 * transaction's id and `g` its generation.
 */
function captureBody(spec: CaptureSpec, event: CaptureEvent, gen: number): string {
  const s = quoteIdent(spec.schema);
  // Straight into the generation's partition: routing through the parent costs more.
  const insert = `INSERT INTO ${s}.${quoteIdent(`ledger_${gen}`)} (gen, source_id, xid, keys)`;
  if (event === 'truncate') return `${insert} VALUES (g, ${spec.sourceId}, x, NULL);`;
  return `${insert}
  SELECT g, ${spec.sourceId}, x, array_agg(k) FROM (${changedKeys(spec, event)}) c HAVING count(*) > 0;`;
}

/** CREATE OR REPLACE of the four trigger functions (no lock on the source). */
export function captureFunctionsSql(spec: CaptureSpec, events = CAPTURE_EVENTS): string[] {
  const pinned = spec.keyTypes.every(settingFree)
    ? ''
    : `\nSET datestyle = 'ISO, YMD' SET intervalstyle = 'postgres' SET extra_float_digits = 3 SET bytea_output = 'hex'`;
  // The transaction's id and its ledger generation, once per statement; then one static
  // INSERT per generation (each keeps its cached plan).
  const s = quoteIdent(spec.schema);
  const branches = (event: CaptureEvent) =>
    Array.from(
      { length: GENERATIONS },
      (_, gen) =>
        `${gen === 0 ? 'IF' : 'ELSIF'} g = ${gen} THEN\n    ${captureBody(spec, event, gen)}`,
    ).join('\n  ');
  return events.map(
    (event) => `CREATE OR REPLACE FUNCTION ${functionName(spec, event)}()
RETURNS trigger LANGUAGE plpgsql${pinned} AS $trellis_capture$
DECLARE
  x bigint := pg_current_xact_id()::text::bigint;
  -- ${s}.ledger_generation(x), inlined: the function call costs more than the arithmetic.
  g smallint := ((x >> ${EPOCH_BITS}) % ${GENERATIONS})::smallint;
BEGIN
  ${branches(event)}
  END IF;
  RETURN NULL;
END
$trellis_capture$`,
  );
}

/**
 * The triggers themselves: AFTER ... FOR EACH STATEMENT with transition tables, and
 * ENABLE ALWAYS so session_replication_role = replica still fires them.
 */
export function captureTriggersSql(spec: CaptureSpec): string[] {
  const statements = CAPTURE_EVENTS.map((event) => {
    const name = quoteIdent(triggerName(spec.schema, event));
    const referencing =
      event === 'insert'
        ? 'REFERENCING NEW TABLE AS trellis_new '
        : event === 'delete'
          ? 'REFERENCING OLD TABLE AS trellis_old '
          : event === 'update'
            ? 'REFERENCING OLD TABLE AS trellis_old NEW TABLE AS trellis_new '
            : '';
    return `CREATE TRIGGER ${name} AFTER ${event.toUpperCase()} ON ${spec.table} ${referencing}FOR EACH STATEMENT EXECUTE FUNCTION ${functionName(spec, event)}()`;
  });
  statements.push(
    `ALTER TABLE ${spec.table} ${CAPTURE_EVENTS.map((e) => `ENABLE ALWAYS TRIGGER ${quoteIdent(triggerName(spec.schema, e))}`).join(', ')}`,
  );
  return statements;
}

/** Removes capture from a table that still exists. */
export function dropTriggersSql(spec: Pick<CaptureSpec, 'schema' | 'table'>): string[] {
  return CAPTURE_EVENTS.map(
    (event) =>
      `DROP TRIGGER IF EXISTS ${quoteIdent(triggerName(spec.schema, event))} ON ${spec.table}`,
  );
}

export function dropFunctionsSql(spec: Pick<CaptureSpec, 'schema' | 'sourceId'>): string[] {
  return CAPTURE_EVENTS.map((event) => `DROP FUNCTION IF EXISTS ${functionName(spec, event)}()`);
}
