import { createHash } from 'node:crypto';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import { EPOCH_BITS, GENERATIONS } from '../internal/ledger.js';

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
  captured: string[];
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

function settingFree(typeWithCollation: string): boolean {
  // A key type may carry its column's collation (`text COLLATE public.ci`): not a setting.
  const type = typeWithCollation.replace(/ COLLATE .*$/, '');
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

/**
 * The row-level capture trigger of a table that is a logical replication subscription's
 * target (issue #21 item 2, ADR 0039): Postgres's apply worker fires row triggers only,
 * never the statement triggers above.
 */
export function rowTriggerName(schema: string): string {
  return triggerName(schema, 'insert').replace('_insert', '_row');
}

export function rowFunctionName(spec: Pick<CaptureSpec, 'schema' | 'sourceId'>): string {
  return `${quoteIdent(spec.schema)}.${quoteIdent(`capture_${spec.sourceId}_row`)}`;
}

function keyArray(spec: CaptureSpec, alias: string): string {
  return `ARRAY[${spec.keyColumns.map((k) => `${alias}.${quoteIdent(k)}::text`).join(', ')}]`;
}

/**
 * Old and new rows pair up when their keys have the same text form, compared byte for
 * byte (COLLATE "C": a text key keeps its own collation through ::text). Not the key
 * type's `=`: a key changed only in case under citext or a case-insensitive collation, or
 * from 1.0 to 1.00, is a different key image, and the target must follow it. Still an
 * equality of texts, so a bulk UPDATE's pairs are found by hashing.
 */
function keyJoin(spec: CaptureSpec, left: string, right: string): string {
  return spec.keyColumns
    .map(
      (k) =>
        `${left}.${quoteIdent(k)}::text COLLATE "C" = ${right}.${quoteIdent(k)}::text COLLATE "C"`,
    )
    .join(' AND ');
}

/**
 * Whether an UPDATE changed any captured column: their value images differ (as
 * `REFRESH MATERIALIZED VIEW CONCURRENTLY` compares rows). Not `IS DISTINCT FROM`, which
 * takes 1.0 = 1.00, 0 = -0 and 'a' = 'A' under citext, and fails on a type without `=`.
 * The function, not the `*<>` operator: between two ROW(...) constructors an operator
 * would be applied column by column, and no column type has `*<>`.
 */
function rowChanged(columns: string[]): string {
  const side = (alias: string) => columns.map((c) => `${alias}.${quoteIdent(c)}`).join(', ');
  return `record_image_ne(ROW(${side('o')}), ROW(${side('n')}))`;
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
      const differs = spec.captured.length ? ` OR ${rowChanged(spec.captured)}` : '';
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
function captureBody(spec: CaptureSpec, event: CaptureEvent | 'everything', gen: number): string {
  const s = quoteIdent(spec.schema);
  // Straight into the generation's partition: routing through the parent costs more.
  const insert = `INSERT INTO ${s}.${quoteIdent(`ledger_${gen}`)} (gen, source_id, xid, keys)`;
  if (event === 'truncate' || event === 'everything') {
    return `${insert} VALUES (g, ${spec.sourceId}, x, NULL);`;
  }
  return `${insert}
  SELECT g, ${spec.sourceId}, x, array_agg(k) FROM (${changedKeys(spec, event)}) c HAVING count(*) > 0;`;
}

/** The one statement per generation that `event` runs (x: the xid, g: its generation). */
function byGeneration(spec: CaptureSpec, event: CaptureEvent | 'everything'): string {
  return `${Array.from(
    { length: GENERATIONS },
    (_, gen) =>
      `${gen === 0 ? 'IF' : 'ELSIF'} g = ${gen} THEN\n    ${captureBody(spec, event, gen)}`,
  ).join('\n  ')}
  END IF;`;
}

/** The source columns `event`'s statement names: it fails if one is renamed or dropped. */
function namedColumns(spec: CaptureSpec, event: CaptureEvent): string[] {
  if (event === 'truncate') return [];
  return event === 'update' ? [...spec.keyColumns, ...spec.captured] : spec.keyColumns;
}

/**
 * Capture must never make the app's write fail (ENGINE.md, I8). Its statement names the
 * source's columns, and a column renamed or dropped (by DDL earlier in the writer's own
 * transaction, or that the staging worker has not seen yet) would make it raise. So it
 * runs only while every column it names is there; otherwise the statement records that
 * any row may have changed (as a TRUNCATE does: readers are rebuilt), and the staging
 * worker brings capture in line with the table, or stops the transforms the change
 * broke (captureFailure). Types need no check: keys are captured as text and columns
 * compared by value image, which every type has.
 */
function guarded(spec: CaptureSpec, event: CaptureEvent): string {
  const names = namedColumns(spec, event);
  if (names.length === 0) return byGeneration(spec, event);
  const list = names.map(quoteLiteral).join(', ');
  return `IF (SELECT count(*) FROM pg_catalog.pg_attribute
       WHERE attrelid = TG_RELID AND attnum > 0 AND NOT attisdropped
         AND attname = ANY (ARRAY[${list}]::name[])) <> ${new Set(names).size} THEN
    ${byGeneration(spec, 'everything').replaceAll('\n', '\n  ')}
    RETURN NULL;
  END IF;
  ${byGeneration(spec, event)}`;
}

/**
 * CREATE OR REPLACE of the four trigger functions (no lock on the source), each followed
 * by the REVOKE of the EXECUTE that Postgres grants PUBLIC on a new function: nothing in
 * Trellis's schema is PUBLIC-executable (ADR 0034). A trigger fires whatever the writing
 * role's EXECUTE (it is checked when the trigger is created), so writers need none.
 */
export function captureFunctionsSql(spec: CaptureSpec, events = CAPTURE_EVENTS): string[] {
  const pinned = pinnedSettings(spec);
  // The transaction's id and its ledger generation, once per statement; then one static
  // INSERT per generation (each keeps its cached plan). The row function (for a
  // subscription's target) names the same columns: it follows every change of the UPDATE
  // function's.
  const s = quoteIdent(spec.schema);
  const row = events.includes('update') ? rowCaptureFunctionSql(spec) : [];
  return events
    .flatMap((event) => [
      `CREATE OR REPLACE FUNCTION ${functionName(spec, event)}()
RETURNS trigger LANGUAGE plpgsql${pinned} AS $trellis_capture$
DECLARE
  x bigint := pg_current_xact_id()::text::bigint;
  -- ${s}.ledger_generation(x), inlined: the function call costs more than the arithmetic.
  g smallint := ((x >> ${EPOCH_BITS}) % ${GENERATIONS})::smallint;
BEGIN
  ${guarded(spec, event)}
  RETURN NULL;
END
$trellis_capture$`,
      `REVOKE EXECUTE ON FUNCTION ${functionName(spec, event)}() FROM PUBLIC`,
    ])
    .concat(row);
}

/** The settings a capture function pins, when a key type's text form depends on them. */
function pinnedSettings(spec: CaptureSpec): string {
  return spec.keyTypes.every(settingFree)
    ? ''
    : `\nSET datestyle = 'ISO, YMD' SET intervalstyle = 'postgres' SET extra_float_digits = 3 SET bytea_output = 'hex'`;
}

/**
 * The row-level capture function (one for INSERT, UPDATE and DELETE): one ledger row per
 * source row, with its key (both keys when an UPDATE moved it to another), none for an
 * UPDATE that changed no captured column's image. Guarded as the statement functions are:
 * a column renamed or dropped records that any row may have changed. Only the apply worker
 * of a subscription fires it (ENABLE REPLICA): the app's own writes are captured once, by
 * the statement triggers.
 */
export function rowCaptureFunctionSql(spec: CaptureSpec): string[] {
  const s = quoteIdent(spec.schema);
  const names = [...spec.keyColumns, ...spec.captured];
  const list = names.map(quoteLiteral).join(', ');
  const keyMoved = spec.keyColumns
    .map(
      (k) =>
        `NEW.${quoteIdent(k)}::text COLLATE "C" IS DISTINCT FROM OLD.${quoteIdent(k)}::text COLLATE "C"`,
    )
    .join(' OR ');
  const changed = spec.captured.length
    ? `record_image_ne(ROW(${spec.captured.map((c) => `OLD.${quoteIdent(c)}`).join(', ')}), ROW(${spec.captured.map((c) => `NEW.${quoteIdent(c)}`).join(', ')}))`
    : 'false';
  const insert = Array.from(
    { length: GENERATIONS },
    (_, gen) =>
      `${gen === 0 ? 'IF' : 'ELSIF'} g = ${gen} THEN\n    INSERT INTO ${s}.${quoteIdent(`ledger_${gen}`)} (gen, source_id, xid, keys) VALUES (g, ${spec.sourceId}, x, k);`,
  ).join('\n  ');
  return [
    `CREATE OR REPLACE FUNCTION ${rowFunctionName(spec)}()
RETURNS trigger LANGUAGE plpgsql${pinnedSettings(spec)} AS $trellis_capture$
DECLARE
  x bigint := pg_current_xact_id()::text::bigint;
  g smallint := ((x >> ${EPOCH_BITS}) % ${GENERATIONS})::smallint;
  k text[];
BEGIN
  IF (SELECT count(*) FROM pg_catalog.pg_attribute
       WHERE attrelid = TG_RELID AND attnum > 0 AND NOT attisdropped
         AND attname = ANY (ARRAY[${list}]::name[])) <> ${new Set(names).size} THEN
    k := NULL;
  ELSIF TG_OP = 'INSERT' THEN
    k := ARRAY[${encodedKey(spec, 'NEW')}];
  ELSIF TG_OP = 'DELETE' THEN
    k := ARRAY[${encodedKey(spec, 'OLD')}];
  ELSIF ${keyMoved} THEN
    k := ARRAY[${encodedKey(spec, 'OLD')}, ${encodedKey(spec, 'NEW')}];
  ELSIF ${changed} THEN
    k := ARRAY[${encodedKey(spec, 'NEW')}];
  ELSE
    RETURN NULL;
  END IF;
  ${insert}
  END IF;
  RETURN NULL;
END
$trellis_capture$`,
    `REVOKE EXECUTE ON FUNCTION ${rowFunctionName(spec)}() FROM PUBLIC`,
  ];
}

/**
 * The row trigger on a subscription's target, ENABLE REPLICA: it fires in sessions with
 * session_replication_role = replica (the apply worker's), where the statement triggers
 * (ENABLE ALWAYS) fire too for any statement but the apply worker's. Such a session other
 * than the apply worker captures its rows twice: harmless, they are re-derived twice.
 */
export function rowTriggerSql(spec: Pick<CaptureSpec, 'schema' | 'sourceId' | 'table'>): string[] {
  const name = quoteIdent(rowTriggerName(spec.schema));
  return [
    `DROP TRIGGER IF EXISTS ${name} ON ${spec.table}`,
    `CREATE TRIGGER ${name} AFTER INSERT OR UPDATE OR DELETE ON ${spec.table} FOR EACH ROW EXECUTE FUNCTION ${rowFunctionName(spec)}()`,
    `ALTER TABLE ${spec.table} ENABLE REPLICA TRIGGER ${name}`,
  ];
}

export function dropRowTriggerSql(spec: Pick<CaptureSpec, 'schema' | 'table'>): string {
  return `DROP TRIGGER IF EXISTS ${quoteIdent(rowTriggerName(spec.schema))} ON ${spec.table}`;
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

/** Drops the capture functions; the row trigger (if any) must be gone first. */
export function dropFunctionsSql(spec: Pick<CaptureSpec, 'schema' | 'sourceId'>): string[] {
  return CAPTURE_EVENTS.map(
    (event) => `DROP FUNCTION IF EXISTS ${functionName(spec, event)}()`,
  ).concat(`DROP FUNCTION IF EXISTS ${rowFunctionName(spec)}()`);
}
