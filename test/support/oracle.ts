import type postgres from 'postgres';
import { expect } from 'vitest';

/**
 * The test suite's oracle, independent of the engine: a target must equal its definition
 * as the test wrote it, run by Postgres as a plain SELECT. Nothing the engine generated or
 * stored (its catalog, its analysed SQL) takes part, so a mistake in turning a statement
 * into SQL cannot be copied into both sides.
 *
 * A test writes its transforms as `Definition`s: the TRANSFORM statement given to the
 * engine and the SELECT run here are both built from the same parts, by the two small
 * functions below.
 */
export interface Definition {
  target: string;
  /** What follows FROM: the source, with its joins (`a LEFT JOIN b ON b.id = a.b_id`). */
  from: string;
  /** The SELECT list. */
  select: string;
  where?: string;
  groupBy?: string;
  having?: string;
  /**
   * SELECT items for the key columns the target adds on its own (a projection's source
   * key when the SELECT list lacks it: `'id'`, `'a.id AS id, b.id AS b_id'`).
   */
  implicit?: string;
  /** Trailing options of the statement (`WITHOUT SOURCE INDEX`). */
  options?: string;
  /**
   * For a chain: the definitions of the targets its FROM names (by their bare names). The
   * oracle recomputes it from the base tables, each of these run as a CTE of that name in
   * its place, never from the upstream target (engine output).
   */
  reads?: Definition[];
  /**
   * The target's key columns, when the test knows them: the key found (the primary key,
   * or the unique index standing for it) must be exactly these, in any order.
   */
  key?: string[];
  /**
   * `'as'`: the statement is the view's SQL, `TRANSFORM target AS SELECT …` (ADR 0049),
   * the same SELECT the oracle runs, without the implicit columns.
   */
  form?: 'as';
  /** `SELECT DISTINCT` (either form). */
  distinct?: boolean;
  /** A trailing ORDER BY of the AS form's statement: the engine drops it, the oracle too. */
  orderBy?: string;
  /**
   * The SELECT list (and what follows it up to FROM) the oracle runs in place of `select`,
   * when the two differ by more than `implicit`: a UNION ALL at the top, whose first
   * branch gets the columns the engine adds to identify its rows (`1 AS "trellis#branch",
   * ROW(a.id)::text AS "trellis#key"`) here, the last branch in `implicit`.
   */
  oracleSelect?: string;
  /**
   * The FROM the oracle runs in place of `from`, when the target keys rows by a column the
   * statement does not write: a LATERAL's position (`WITH ORDINALITY AS t(el, ordinality)`,
   * the target's implicit `ordinality`, ADR 0071).
   */
  oracleFrom?: string;
  /**
   * The AS form's WITH queries, as written after `WITH` (`a AS (SELECT …), b AS (…)`): the
   * statement and the oracle's query both start with them.
   */
  with?: string;
}

/** The TRANSFORM statement for a definition. */
export function transformStatement(d: Definition): string {
  if (d.form === 'as') {
    return [
      `TRANSFORM ${d.target} AS`,
      d.with ? `WITH ${d.with}` : '',
      selectOf(d, null, false),
      d.orderBy ? `ORDER BY ${d.orderBy}` : '',
      d.options ?? '',
    ]
      .filter(Boolean)
      .join(' ');
  }
  return [
    `TRANSFORM ${d.target} FROM ${d.from} SELECT ${d.distinct ? 'DISTINCT ' : ''}${d.select}`,
    d.where ? `WHERE ${d.where}` : '',
    d.groupBy ? `GROUP BY ${d.groupBy}` : '',
    d.having ? `HAVING ${d.having}` : '',
    d.options ?? '',
  ]
    .filter(Boolean)
    .join(' ');
}

/**
 * Sets `reads` on each definition whose FROM names another's target (a chain), so the
 * oracle recomputes it from the base tables. Returns `defs`, changed in place.
 */
export function linkChains<T extends Definition[] | Record<string, Definition>>(defs: T): T {
  const all = Object.values(defs) as Definition[];
  const byTarget = new Map(all.map((d) => [d.target, d]));
  for (const d of all) {
    const named = d.from.match(/[A-Za-z_][A-Za-z0-9_$]*/g) ?? [];
    const reads = named.flatMap((n) => {
      const up = byTarget.get(n);
      return up && up !== d ? [up] : [];
    });
    if (reads.length) d.reads = [...new Set(reads)];
  }
  return defs;
}

/** The definitions a chain reads, deepest first, each once. */
function upstreamOf(d: Definition, seen = new Set<string>()): Definition[] {
  const order: Definition[] = [];
  for (const up of d.reads ?? []) {
    if (seen.has(up.target)) continue;
    seen.add(up.target);
    order.push(...upstreamOf(up, seen), up);
  }
  return order;
}

/**
 * The definition's own SELECT, with the target's implicit key columns unless `implicit` is
 * false (the AS form's statement). An upstream target named with its schema (`derived.x1`,
 * a target outside the search path) is read from its CTE all the same; with `targetSchema`
 * null, FROM is left as written (the statement itself).
 */
function selectOf(d: Definition, targetSchema: string | null, implicit = true): string {
  let from = implicit && d.oracleFrom ? d.oracleFrom : d.from;
  for (const up of targetSchema === null ? [] : (d.reads ?? [])) {
    const escaped = `${targetSchema}.${up.target}`.replaceAll('.', '\\.');
    from = from.replace(new RegExp(`(?<![\\w."])"?${escaped}"?(?![\\w"])`, 'g'), up.target);
  }
  return [
    `SELECT ${d.distinct ? 'DISTINCT ' : ''}${implicit && d.oracleSelect ? d.oracleSelect : d.select}${implicit && d.implicit ? `, ${d.implicit}` : ''} FROM ${from}`,
    d.where ? `WHERE ${d.where}` : '',
    d.groupBy ? `GROUP BY ${d.groupBy}` : '',
    d.having ? `HAVING ${d.having}` : '',
  ]
    .filter(Boolean)
    .join(' ');
}

/**
 * The definition as a plain SELECT, with the target's implicit key columns; a chain's
 * upstream targets recomputed from their own definitions (`reads`), as CTEs named after
 * them, which the chain's FROM then reads instead of the targets.
 */
export function definitionQuery(d: Definition, targetSchema = 'public'): string {
  const upstream = upstreamOf(d);
  const ctes = upstream.map(
    (up) => `"${up.target.replaceAll('"', '""')}" AS (${selectOf(up, targetSchema)})`,
  );
  if (d.with) ctes.push(d.with);
  return `${ctes.length ? `WITH ${ctes.join(', ')} ` : ''}${selectOf(d, targetSchema)}`;
}

export interface OracleOptions {
  /** The schema the target lives in. @defaultValue `'public'` */
  targetSchema?: string;
  /** search_path the definition's query runs with. @defaultValue `'public'` */
  searchPath?: string;
  /**
   * Other settings the definition's query (and the rendering of both sides as text) runs
   * under, as the test defined the transform (`{ timezone: 'Pacific/Auckland' }`).
   * @defaultValue the session's
   */
  settings?: Record<string, string>;
  /**
   * Relative tolerance for float4/float8 columns (aggregates over floats depend on the
   * order rows are summed in). 0 compares floats exactly, as text. @defaultValue `1e-9`
   */
  floatTolerance?: number;
  /**
   * Leave out the target's columns a redefinition stages before its switch
   * (`trellis#<id>#<n>`, ADR 0055's addendum): the old definition is compared while they
   * are there. @defaultValue false
   */
  ignoreStaged?: boolean;
}

export interface Comparison {
  /** Target columns the definition does not produce, and the reverse. */
  strayColumns: string[];
  missingColumns: string[];
  /** Rows the definition produces and the target lacks (as many times as lacking), and the reverse. */
  missing: Array<Record<string, string | null>>;
  extra: Array<Record<string, string | null>>;
  /**
   * Whether the target has its key: a primary key, or the unique index standing for one
   * (NULLS NOT DISTINCT, not partial, on plain columns, valid), equal to `Definition.key`
   * when given, and unique over the definition's rows (the key identifies them).
   */
  hasKey: boolean;
  /** The key's columns, or null when it has none. */
  key: string[] | null;
  /** Columns whose type differs from the definition's: `name: target type != definition type`. */
  typeMismatches: string[];
}

const FLOAT_TYPES = new Set(['float4', 'float8']);

function sameSet(a: string[], b: string[]): boolean {
  return a.length === b.length && [...a].sort().join('\n') === [...b].sort().join('\n');
}

interface Column {
  name: string;
  float: boolean;
}

function rowKey(row: Record<string, string | null>, columns: Column[]): string {
  return JSON.stringify(columns.map((c) => row[c.name] ?? null));
}

function floatsClose(a: string, b: string, tolerance: number): boolean {
  const x = Number(a);
  const y = Number(b);
  if (Number.isNaN(x) || Number.isNaN(y)) return a === b;
  if (!Number.isFinite(x) || !Number.isFinite(y)) return x === y;
  return Math.abs(x - y) <= tolerance * Math.max(Math.abs(x), Math.abs(y), 1e-300);
}

/**
 * Compares the target with its definition: every physical column of the target, every
 * row, as multisets both ways. Values compare by their exact text form (so 1.0 and 1.00,
 * -0 and 0, 'a' and 'A' differ), NULL only with NULL; floats within `floatTolerance`.
 */
export async function compareWithDefinition(
  sql: postgres.Sql,
  d: Definition,
  options: OracleOptions = {},
): Promise<Comparison> {
  const schema = options.targetSchema ?? 'public';
  const tolerance = options.floatTolerance ?? 1e-9;
  const quote = (n: string) => `"${n.replaceAll('"', '""')}"`;
  const target = `${quote(schema)}.${quote(d.target)}`;
  const targetColumns = await sql<{ name: string; type: string; declared: string }[]>`
    SELECT a.attname AS name, t.typname AS type, format_type(a.atttypid, a.atttypmod) AS declared
      FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
     WHERE a.attrelid = ${target}::regclass AND a.attnum > 0 AND NOT a.attisdropped
     ORDER BY a.attnum`;
  // The target's key: its primary key, or else the one unique index that stands for one
  // (a key whose columns can be NULL, ADR 0008: NULLS NOT DISTINCT; a grand total's). Not
  // any unique index: a partial one, an expression's, or one NULLs slip through is no key.
  const nullsNotDistinct =
    (await sql<{ v: number }[]>`SELECT current_setting('server_version_num')::int AS v`)[0]!.v >=
    150000
      ? 'i.indnullsnotdistinct'
      : 'false';
  const keys = await sql.unsafe<{ primary: boolean; columns: string[] }[]>(
    `SELECT i.indisprimary AS primary,
            ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) k(attnum)
                    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) AS columns
       FROM pg_index i
      WHERE i.indrelid = $1::regclass AND i.indisvalid AND i.indisunique AND i.indpred IS NULL
        -- Plain columns; or a grand total's one row, a unique index on ((true)) (key: none).
        AND ((i.indexprs IS NULL AND 0 <> ALL (i.indkey::int2[]))
             OR (i.indnatts = 1 AND pg_get_expr(i.indexprs, i.indrelid) = 'true'))
        AND (i.indisprimary OR ${nullsNotDistinct}
             OR NOT EXISTS (SELECT 1 FROM unnest(i.indkey::int2[]) k(attnum)
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                             WHERE NOT a.attnotnull))
      ORDER BY i.indisprimary DESC, i.indexrelid`,
    [target],
  );
  const key = keys[0]?.columns ?? null;
  return sql.begin(async (tx) => {
    await tx.unsafe(`SET LOCAL search_path = ${options.searchPath ?? 'public'}`);
    for (const [name, value] of Object.entries(options.settings ?? {})) {
      await tx.unsafe('SELECT set_config($1, $2, true)', [name, value]);
    }
    await tx.unsafe(`CREATE TEMP VIEW trellis_oracle_definition AS ${definitionQuery(d, schema)}`);
    const definitionColumns = await tx<{ name: string; declared: string }[]>`
      SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS declared FROM pg_attribute a
       WHERE a.attrelid = 'trellis_oracle_definition'::regclass AND a.attnum > 0 ORDER BY a.attnum`;
    const definitionTypes = new Map(definitionColumns.map((c) => [c.name, c.declared]));
    const typeMismatches = targetColumns
      .filter((c) => definitionTypes.has(c.name) && definitionTypes.get(c.name) !== c.declared)
      .map((c) => `${c.name}: ${c.declared} != ${definitionTypes.get(c.name)}`);
    // The key identifies the definition's rows: no two share its values (NULLs as equal).
    let keyHolds = key !== null && (d.key === undefined || sameSet(key, d.key));
    if (keyHolds && key?.every((k) => definitionTypes.has(k))) {
      // (No key columns: a grand total, at most one row.)
      const [dupes] = await tx.unsafe<{ n: number }[]>(
        `SELECT count(*)::int AS n FROM (SELECT 1 FROM trellis_oracle_definition
           GROUP BY ${key.map((k) => `${quote(k)}::text COLLATE "C"`).join(', ') || '()'} HAVING count(*) > 1) x`,
      );
      keyHolds = dupes?.n === 0;
    }
    const produced = new Set(definitionColumns.map((c) => c.name));
    const held = new Set(targetColumns.map((c) => c.name));
    const strayColumns = [...held].filter(
      (c) => !produced.has(c) && !(options.ignoreStaged && c.startsWith('trellis#')),
    );
    const missingColumns = [...produced].filter((c) => !held.has(c));
    const columns: Column[] = targetColumns
      .filter((c) => produced.has(c.name))
      .map((c) => ({ name: c.name, float: tolerance > 0 && FLOAT_TYPES.has(c.type) }));
    // Exact multiset difference first, in Postgres (EXCEPT ALL over the text forms, compared
    // byte for byte); leftovers then pair up when only floats differ, and within the
    // tolerance.
    const asText = (from: string) =>
      `SELECT ${columns.map((c) => `${quote(c.name)}::text COLLATE "C" AS ${quote(c.name)}`).join(', ') || '1 AS trellis_oracle_none'} FROM ${from}`;
    const side = 'trellis_oracle_side';
    const leftovers = (await tx.unsafe(
      `WITH t AS (${asText(target)}), d AS (${asText('trellis_oracle_definition')})
       SELECT 'extra' AS ${side}, * FROM (TABLE t EXCEPT ALL TABLE d) x
       UNION ALL
       SELECT 'missing' AS ${side}, * FROM (TABLE d EXCEPT ALL TABLE t) y`,
    )) as unknown as Array<Record<string, string | null>>;
    await tx.unsafe('DROP VIEW trellis_oracle_definition');
    const rowsOf = (which: string) =>
      leftovers
        .filter((row) => row[side] === which)
        .map((row) => Object.fromEntries(columns.map((c) => [c.name, row[c.name] ?? null])));
    let extra = rowsOf('extra');
    let missing = rowsOf('missing');
    if (columns.some((c) => c.float) && missing.length > 0 && extra.length > 0) {
      const exact = columns.filter((c) => !c.float);
      const floats = columns.filter((c) => c.float);
      const unmatched: Array<Record<string, string | null>> = [];
      const pool = [...extra];
      for (const row of missing) {
        const k = rowKey(row, exact);
        const i = pool.findIndex(
          (other) =>
            rowKey(other, exact) === k &&
            floats.every((c) => {
              const a = row[c.name] ?? null;
              const b = other[c.name] ?? null;
              return a === null || b === null ? a === b : floatsClose(a, b, tolerance);
            }),
        );
        if (i >= 0) pool.splice(i, 1);
        else unmatched.push(row);
      }
      missing = unmatched;
      extra = pool;
    }
    return { strayColumns, missingColumns, missing, extra, hasKey: keyHolds, key, typeMismatches };
  });
}

/** Fails the test, showing what differs, unless the target equals its definition. */
export async function expectMatchesDefinition(
  sql: postgres.Sql,
  d: Definition,
  options: OracleOptions = {},
): Promise<void> {
  const result = await compareWithDefinition(sql, d, options);
  const show = <T>(rows: T[]) => rows.slice(0, 10);
  expect({
    target: d.target,
    strayColumns: result.strayColumns,
    missingColumns: result.missingColumns,
    missing: show(result.missing),
    extra: show(result.extra),
    missingCount: result.missing.length,
    extraCount: result.extra.length,
    typeMismatches: result.typeMismatches,
    hasKey: result.hasKey,
    key: result.key,
  }).toEqual({
    target: d.target,
    strayColumns: [],
    missingColumns: [],
    missing: [],
    extra: [],
    missingCount: 0,
    extraCount: 0,
    typeMismatches: [],
    hasKey: true,
    key: result.key ?? ['(a key)'],
  });
}
