import fc from 'fast-check';
import type { Definition } from './oracle.js';
import {
  type Column,
  columnsOf,
  keyColumns,
  type Naming,
  physical,
  refColumns,
  type Schema,
  TABLE_NAMES,
  tableSql,
} from './random-schema.js';
import { type ColumnType, comparand } from './random-values.js';
import { placeTables } from './random-writes.js';

/**
 * Random TRANSFORMs over a random schema (random-schema.ts), written as the oracle's
 * Definitions: projections with expressions and filters, GROUP BY with assorted aggregates
 * and HAVING, grand totals, inner and left joins of two and three tables (equality on a
 * key and the other table's reference to it, or on any two columns of one type, plus
 * predicates on the joined side),
 * anti-joins (`WHERE b.id IS NULL`), and chains (a projection or GROUP BY reading the
 * target of a projection over inner joins, or of a GROUP BY of bare NOT NULL columns).
 *
 * A transform is generated as choices (which table, column, template: natural numbers
 * taken modulo what is there), then read against the schema: a choice always means
 * something, so fast-check can shrink any part of it (drop a join, a column, a filter)
 * and still have a valid statement.
 *
 * Only definitions Postgres computes deterministically: nothing groups by, or takes the
 * min, max or a percentile of, values equal under their type's `=` but written differently (1.0 and
 * 1.00, 0 and -0, 'a' and 'A' under citext or ci: which one a group shows depends on row
 * order), so those are grouped through their text (`n::text`, `s COLLATE "C"`); ordered
 * aggregates (string_agg, array_agg) order by every key after the value; HAVING compares
 * counts, integer sums and booleans, never floats.
 */

/** A column as an expression can read it. */
interface ScopeColumn {
  alias: string;
  name: string;
  type: ColumnType;
  nullable: boolean;
}

/** A table (or upstream target) in a transform's FROM. */
interface Source {
  alias: string;
  /** Logical name: a table's (a, b, c) or an upstream target's (x1). */
  name: string;
  keys: ScopeColumn[];
  columns: ScopeColumn[];
  /**
   * `outer`: the first join written as a RIGHT JOIN (this table first, the driving one
   * RIGHT JOINed to it: the LEFT JOIN it is kept as, ADR 0066) or as a FULL JOIN.
   */
  join: { left: boolean; on: string; outer?: 'right' | 'full'; later?: boolean } | null;
  /**
   * A `CROSS JOIN LATERAL` over a set-returning function of an earlier source's column
   * (ADR 0071), as written, and as the oracle runs it (with the position it keys by).
   */
  lateral?: { sql: string; oracle: string };
  /** What its join is made of, for the generator's coverage (`constructsOf`). */
  constructs?: string[];
  /**
   * A subquery's FROM item, in place of a table's name (`(SELECT …) AS dt`, `w1 dt`), its
   * tables named `«a»` (random-views.ts).
   */
  sql?: string;
}

/** What an expression is: its SQL, its type, and the column when it is one, bare. */
interface Expr {
  sql: string;
  type: ColumnType;
  bare: ScopeColumn | null;
}

/** Which column of which source, and which of its templates: taken modulo what there is. */
export interface Pick {
  source: number;
  column: number;
  template: number;
}

export interface JoinChoice {
  table: number;
  left: boolean;
  /** The joined table holds the reference (b.to_a = a.id), instead of being looked up (b.id = a.to_b). */
  reverse: boolean;
  /** Which table already in FROM it joins. */
  to: number;
  /**
   * Joins on a pair of columns of one type (any two, keys or not: many rows can match
   * many, and under citext, ci, numeric or float8 values of different images match),
   * instead of on a key and the reference to it; null for the latter.
   */
  values: number | null;
  /** A predicate on the joined table, in ON. */
  extra: Pick | null;
  /** One more condition in ON: two columns of one type compared (the joined table's and any). */
  cross: Pick | null;
  /** Joins a table already in FROM again (a self-join): which one; null for a new table. */
  again: number | null;
  /**
   * As the first join, where the form allows: 0 a RIGHT JOIN, 1 a FULL JOIN (ADR 0066);
   * anything else as drawn.
   */
  outer: number;
}

interface QueryChoice {
  /** `distinct`: SELECT DISTINCT of GROUP BY expressions (ADR 0049), no aggregates. */
  kind: 'rows' | 'groups' | 'total' | 'distinct';
  /** `with`: the item combines the column with a second one (of any source): `a.i1 + b.i2`. */
  items: Array<{ pick: Pick; name: number; with: Pick | null }>;
  where: Pick | null;
  /** A second condition in WHERE, AND or OR the first: on a column, or two compared. */
  alsoWhere: { pick: Pick; or: boolean; cross: boolean } | null;
  groups: Array<{ pick: Pick; selected: boolean; name: number }>;
  aggregates: Array<{ pick: Pick; filter: Pick | null; name: number }>;
  having: Pick | null;
  /**
   * Aggregates and HAVING only of those kept by delta (ADR 0044), some inside an
   * expression: otherwise most GROUP BYs mix in one that needs its groups' rows.
   */
  delta: boolean;
}

export interface TransformChoice extends QueryChoice {
  driving: number;
  joins: JoinChoice[];
  /** A WHERE <last LEFT JOINed table's key> IS NULL. */
  anti: boolean;
  /** A transform reading this one's target (when it is a projection keyed by non-NULL keys). */
  chain: QueryChoice | null;
  /** The chain's FROM joins a table to the upstream target (on two columns of one type). */
  chainJoin: JoinChoice | null;
  /** A transform reading the chain's target, in turn (a chain of two). */
  chain2: QueryChoice | null;
  /**
   * How the statement is written: 1 in `options`' range, `WITHOUT SOURCE INDEX`; 1 in
   * `form`'s, the AS form (`TRANSFORM x AS SELECT …`, ADR 0049), 2 with a trailing ORDER BY.
   */
  options: number;
  form: number;
  /**
   * View SQL (random-views.ts): a derived table, WITH query or UNION as the FROM, a
   * semi- or anti-join, a scalar subquery, or a UNION at the top; null for none.
   */
  view: ViewChoice | null;
}

const SYSTEM_COLUMNS = ['tableoid', 'xmin', 'cmin', 'xmax', 'cmax', 'ctid'];

function at<T>(items: readonly T[], n: number): T {
  return items[n % items.length]!;
}

const col = (c: ScopeColumn) => `${c.alias}.${c.name}`;

type Template = (c: string) => { sql: string; type: ColumnType };
const same =
  (type: ColumnType): Template =>
  (c) => ({ sql: c, type });
const of =
  (type: ColumnType, f: (c: string) => string): Template =>
  (c) => ({ sql: f(c), type });

/** Expressions of a column for SELECT items (the first is the bare column). */
const VALUES: Record<ColumnType, Template[]> = {
  int: [
    same('int'),
    of('int', (c) => `${c} + 1`),
    of('int', (c) => `abs(${c})`),
    of('int', (c) => `coalesce(${c}, 0)`),
    of('int', (c) => `${c} % 3`),
  ],
  bigint: [same('bigint'), of('bigint', (c) => `${c} - 1`)],
  numeric: [
    same('numeric'),
    of('numeric', (c) => `round(${c}, 1)`),
    of('numeric', (c) => `${c} * 2`),
    of('text', (c) => `${c}::text`),
  ],
  numeric_2: [same('numeric_2'), of('numeric', (c) => `${c} + 1`)],
  float8: [
    same('float8'),
    of('float8', (c) => `${c} * 2`),
    of('float8', (c) => `- ${c}`),
    of('float8', (c) => `abs(${c})`),
  ],
  text: [
    same('text'),
    of('text', (c) => `upper(${c})`),
    of('int', (c) => `length(${c})`),
    of('text', (c) => `${c} || '!'`),
    of('text', (c) => `left(${c}, 2)`),
  ],
  citext: [
    same('citext'),
    of('text', (c) => `${c}::text`),
    of('int', (c) => `length(${c})`),
    of('text', (c) => `lower(${c})`),
  ],
  text_ci: [
    same('text_ci'),
    of('text_ci', (c) => `upper(${c})`),
    of('text', (c) => `${c} COLLATE "C"`),
    of('int', (c) => `length(${c})`),
  ],
  boolean: [
    same('boolean'),
    of('boolean', (c) => `NOT ${c}`),
    of('boolean', (c) => `coalesce(${c}, false)`),
  ],
  date: [
    same('date'),
    of('date', (c) => `${c} + 1`),
    of('numeric', (c) => `extract(year FROM ${c})`),
  ],
  jsonb: [
    same('jsonb'),
    of('text', (c) => `${c} ->> 'k'`),
    of('jsonb', (c) => `${c} -> 'k'`),
    of('text', (c) => `jsonb_typeof(${c})`),
  ],
  timestamp: [
    same('timestamp'),
    of('timestamp', (c) => `date_trunc('hour', ${c})`),
    of('date', (c) => `${c}::date`),
    of('timestamp', (c) => `${c} + interval '1 day'`),
  ],
  uuid: [same('uuid'), of('text', (c) => `${c}::text`), of('text', (c) => `left(${c}::text, 8)`)],
  int_array: [
    same('int_array'),
    of('int', (c) => `cardinality(${c})`),
    of('int', (c) => `${c}[1]`),
    of('int_array', (c) => `${c} || 0`),
  ],
};

/**
 * GROUP BY expressions of a column: values equal under `=` have one image (the text of
 * values that have several), so which row a group's key comes from does not show.
 */
const GROUPS: Record<ColumnType, Template[]> = {
  int: [same('int'), of('int', (c) => `${c} % 3`)],
  bigint: [same('bigint')],
  numeric: [of('text', (c) => `${c}::text`), of('numeric', (c) => `round(${c})`)],
  numeric_2: [of('text', (c) => `${c}::text`), of('numeric', (c) => `round(${c})`)],
  float8: [of('text', (c) => `${c}::text`), of('boolean', (c) => `(${c} > 0)`)],
  text: [same('text'), of('text', (c) => `upper(${c})`)],
  citext: [of('text', (c) => `${c}::text`), of('text', (c) => `lower(${c})`)],
  text_ci: [of('text', (c) => `${c} COLLATE "C"`), of('int', (c) => `length(${c})`)],
  boolean: [same('boolean')],
  date: [same('date')],
  jsonb: [of('text', (c) => `${c} ->> 'k'`), of('text', (c) => `jsonb_typeof(${c})`)],
  timestamp: [same('timestamp'), of('timestamp', (c) => `date_trunc('day', ${c})`)],
  uuid: [same('uuid'), of('text', (c) => `left(${c}::text, 1)`)],
  int_array: [same('int_array'), of('int', (c) => `cardinality(${c})`)],
};

/**
 * Aggregates of a column, given the ORDER BY that makes an ordered aggregate's order total,
 * with the type of what they return ('same': the column's; null: one a chain does not read).
 */
interface Aggregate {
  sql: (c: string, keys: string) => string;
  type: ColumnType | 'same' | null;
}
const agg = (type: Aggregate['type'], sql: Aggregate['sql']): Aggregate => ({ sql, type });
const ANY_AGGREGATES: Aggregate[] = [
  agg('bigint', (c) => `count(${c})`),
  agg('bigint', (c) => `count(DISTINCT ${c})`),
  // Under "C": text under ci cast to text keeps its collation, which LIKE on a chain's
  // reading of it refuses (nondeterministic collations are not supported for LIKE).
  agg(
    'text',
    (c, keys) => `string_agg(${c}::text COLLATE "C", ',' ORDER BY ${c}::text COLLATE "C", ${keys})`,
  ),
  agg(null, (c, keys) => `array_agg(${c} ORDER BY ${keys})`),
];
const AGGREGATES: Record<ColumnType, Aggregate[]> = {
  int: [
    agg('bigint', (c) => `sum(${c})`),
    agg('same', (c) => `min(${c})`),
    agg('same', (c) => `max(${c})`),
    agg('numeric', (c) => `avg(${c})`),
    agg('float8', (c) => `percentile_cont(0.5) WITHIN GROUP (ORDER BY ${c})`),
    agg('same', (c) => `percentile_disc(0.25) WITHIN GROUP (ORDER BY ${c})`),
  ],
  bigint: [agg('numeric', (c) => `sum(${c})`), agg('same', (c) => `max(${c})`)],
  numeric: [agg('numeric', (c) => `sum(${c})`), agg('numeric', (c) => `avg(${c})`)],
  numeric_2: [agg('numeric', (c) => `sum(${c})`), agg('numeric', (c) => `avg(${c})`)],
  // No min, max or percentile: 0 and -0 are equal, so which one they return depends on
  // row order.
  float8: [agg('float8', (c) => `sum(${c})`), agg('float8', (c) => `avg(${c})`)],
  text: [agg('same', (c) => `min(${c})`), agg('same', (c) => `max(${c})`)],
  citext: [],
  text_ci: [],
  boolean: [agg('same', (c) => `bool_and(${c})`), agg('same', (c) => `bool_or(${c})`)],
  date: [
    agg('same', (c) => `min(${c})`),
    agg('same', (c) => `max(${c})`),
    agg('same', (c) => `percentile_disc(0.5) WITHIN GROUP (ORDER BY ${c})`),
  ],
  jsonb: [],
  timestamp: [agg('same', (c) => `min(${c})`), agg('same', (c) => `max(${c})`)],
  uuid: [],
  int_array: [agg('same', (c) => `min(${c})`), agg('same', (c) => `max(${c})`)],
};

/**
 * Aggregates kept by delta (ADR 0044): counts, sums and averages of integers and numerics,
 * extremes of integers, dates and text, boolean aggregates.
 */
const DELTA_AGGREGATES: Record<ColumnType, Aggregate[]> = {
  int: [
    agg('bigint', (c) => `sum(${c})`),
    agg('same', (c) => `min(${c})`),
    agg('same', (c) => `max(${c})`),
    agg('numeric', (c) => `avg(${c})`),
  ],
  bigint: [
    agg('numeric', (c) => `sum(${c})`),
    agg('same', (c) => `max(${c})`),
    agg('numeric', (c) => `avg(${c})`),
  ],
  numeric: [agg('numeric', (c) => `sum(${c})`), agg('numeric', (c) => `avg(${c})`)],
  numeric_2: [agg('numeric', (c) => `sum(${c})`), agg('numeric', (c) => `avg(${c})`)],
  float8: [],
  text: [agg('same', (c) => `min(${c})`), agg('same', (c) => `max(${c})`)],
  citext: [],
  text_ci: [],
  boolean: [
    agg('same', (c) => `bool_and(${c})`),
    agg('same', (c) => `bool_or(${c})`),
    agg('same', (c) => `every(${c})`),
  ],
  date: [agg('same', (c) => `min(${c})`), agg('same', (c) => `max(${c})`)],
  jsonb: [],
  timestamp: [agg('same', (c) => `min(${c})`), agg('same', (c) => `max(${c})`)],
  uuid: [],
  int_array: [],
};

/** Predicates on a column (WHERE, ON, FILTER). */
const PREDICATES: Record<ColumnType, Array<(c: string) => string>> = {
  int: [(c) => `${c} > ${comparand('int')}`, (c) => `${c} % 2 = 0`],
  bigint: [(c) => `${c} > ${comparand('bigint')}`],
  numeric: [(c) => `${c} > ${comparand('numeric')}`, (c) => `${c} = 1`],
  numeric_2: [(c) => `${c} > ${comparand('numeric_2')}`],
  float8: [(c) => `${c} > 0`, (c) => `${c} = 0`],
  text: [(c) => `${c} > 'b'`, (c) => `${c} = 'abc'`, (c) => `${c} LIKE 'a%'`],
  citext: [(c) => `${c} = 'abc'`, (c) => `${c} > 'b'`],
  text_ci: [(c) => `${c} = 'abc'`, (c) => `${c} > 'b'`],
  boolean: [(c) => c, (c) => `NOT ${c}`],
  date: [(c) => `${c} > ${comparand('date')}`],
  jsonb: [(c) => `jsonb_typeof(${c}) = 'object'`, (c) => `${c} @> ${comparand('jsonb')}`],
  timestamp: [(c) => `${c} > ${comparand('timestamp')}`, (c) => `date_trunc('day', ${c}) = ${c}`],
  uuid: [
    (c) => `${c} = ${comparand('uuid')}`,
    (c) => `${c} > 'b0000000-0000-0000-0000-000000000000'`,
  ],
  int_array: [
    (c) => `${c} @> ${comparand('int_array')}`,
    (c) => `cardinality(${c}) > 1`,
    (c) => `2 = ANY (${c})`,
  ],
};
const NULL_PREDICATES: Array<(c: string) => string> = [
  (c) => `${c} IS NULL`,
  (c) => `${c} IS NOT NULL`,
];

/** Comparisons of two columns of one type (in WHERE and ON). */
const COMPARISONS = ['=', '<', '<>', 'IS DISTINCT FROM'];

/**
 * A comparison of the picked column with another column of its type, from any source, or
 * (when it has none) a predicate on it.
 */
function crossPredicate(sources: Source[], pick: Pick, first = column(sources, pick)): string {
  const others = sources.flatMap((s) =>
    s.columns.filter((c) => c.type === first.type && col(c) !== col(first)),
  );
  if (others.length === 0) return predicate(sources, pick);
  const other = at(others, pick.template);
  return `${col(first)} ${at(COMPARISONS, pick.template >> 2)} ${col(other)}`;
}

const NUMBERS: ReadonlySet<ColumnType> = new Set(['int', 'bigint', 'numeric', 'numeric_2']);

/**
 * Two expressions in one SELECT item: numbers added, anything else joined as text (each
 * side under "C", so the item's collation is no source's).
 */
function combined(x: Expr, y: Expr): Expr {
  if (NUMBERS.has(x.type) && NUMBERS.has(y.type)) {
    const type: ColumnType =
      x.type === 'int' && y.type === 'int'
        ? 'int'
        : x.type.startsWith('numeric') || y.type.startsWith('numeric')
          ? 'numeric'
          : 'bigint';
    return { sql: `(${x.sql}) + (${y.sql})`, type, bare: null };
  }
  return {
    sql: `(${x.sql})::text COLLATE "C" || '|' || (${y.sql})::text COLLATE "C"`,
    type: 'text',
    bare: null,
  };
}

/** HAVING conditions: on counts, integer sums and booleans only (never floats). */
const HAVINGS: Array<(c: ScopeColumn) => string | null> = [
  () => 'count(*) > 1',
  (c) => `count(DISTINCT ${col(c)}) > 1`,
  (c) => (c.type === 'int' ? `sum(${col(c)}) > 0` : null),
  (c) => (c.type === 'boolean' ? `bool_or(${col(c)})` : null),
  (c) => (c.type === 'date' ? `max(${col(c)}) IS NOT NULL` : null),
  () => 'count(*) > 0',
];

function column(sources: Source[], pick: Pick): ScopeColumn {
  const source = at(sources, pick.source);
  return at(source.columns, pick.column);
}

function valueExpr(sources: Source[], pick: Pick): Expr {
  const c = column(sources, pick);
  const templates = VALUES[c.type];
  const n = pick.template % templates.length;
  const e = templates[n]!(col(c));
  return { ...e, bare: n === 0 ? c : null };
}

function groupExpr(sources: Source[], pick: Pick): Expr {
  const c = column(sources, pick);
  const e = at(GROUPS[c.type], pick.template)(col(c));
  return { ...e, bare: e.sql === col(c) ? c : null };
}

function predicate(sources: Source[], pick: Pick): string {
  const c = column(sources, pick);
  const templates = [...PREDICATES[c.type], ...(c.nullable ? NULL_PREDICATES : [])];
  return at(templates, pick.template)(col(c));
}

function aggregate(
  sources: Source[],
  pick: Pick,
  keys: string,
  delta = false,
): { sql: string; type: ColumnType | null } {
  if (pick.template % 5 === 0) return { sql: 'count(*)', type: 'bigint' };
  const c = column(sources, pick);
  if (delta) {
    const a = at([...DELTA_AGGREGATES[c.type], agg('bigint', (x) => `count(${x})`)], pick.template);
    return { sql: a.sql(col(c), keys), type: a.type === 'same' ? c.type : a.type };
  }
  // Not array_agg of arrays: arrays of other lengths, or NULL, cannot be accumulated.
  const any = c.type === 'int_array' ? ANY_AGGREGATES.slice(0, 3) : ANY_AGGREGATES;
  const a = at([...AGGREGATES[c.type], ...any], pick.template);
  return { sql: a.sql(col(c), keys), type: a.type === 'same' ? c.type : a.type };
}

/**
 * A kept-by-delta aggregate (with its FILTER) inside an expression over it alone, as
 * views write them (`coalesce(sum(x), 0)`), for one pick in three of a number.
 */
function deltaExpression(sql: string, type: ColumnType | null, template: number): string {
  const numeric = type === 'int' || type === 'bigint' || type === 'numeric' || type === 'numeric_2';
  if (!numeric) return sql;
  if (template % 3 === 1) return `coalesce(${sql}, 0)`;
  if (template % 3 === 2) return `${sql} * 2`;
  return sql;
}

function having(sources: Source[], pick: Pick, delta = false): string {
  const c = column(sources, pick);
  // Kept by delta: not count(DISTINCT ...), the one HAVING here that needs a group's rows.
  const havings = delta ? HAVINGS.filter((_, i) => i !== 1) : HAVINGS;
  for (let i = 0; i < havings.length; i += 1) {
    const h = at(havings, pick.template + i)(c);
    if (h) return h;
  }
  return 'count(*) > 1';
}

/** Names a SELECT item may get besides its own (o1, g1, n1...): the keys' names, taken. */
const KEY_LIKE_NAMES = ['id', 'k1', 'k2'];

function itemName(fallback: string, choice: number, used: Set<string>): string {
  const name = choice % 4 === 3 ? at(KEY_LIKE_NAMES, choice >> 2) : fallback;
  const chosen = used.has(name) ? fallback : name;
  used.add(chosen);
  return chosen;
}

/** A transform read against its schema: what the statement and the oracle are built from. */
export interface Transform {
  /** Logical target name (x1, x1c for the chain reading it); the physical one has the prefix. */
  name: string;
  /** A row per (joined) source row, a row per group, or one row (a grand total). */
  kind: QueryChoice['kind'];
  /** Its WHERE starts with `<last LEFT JOINed table's key> IS NULL`. */
  anti: boolean;
  sources: Source[];
  /** Its items; `type` null for one a chain does not read (an array). */
  select: Array<{ sql: string; name: string; type: ColumnType | null; bare: ScopeColumn | null }>;
  where: string[];
  groupBy: string[];
  having: string | null;
  /** Its aggregates are all of those kept by delta (a GROUP BY or grand total). */
  delta: boolean;
  implicit: string[];
  /** The target's key columns (for a chain reading it), in key order. */
  keys: ScopeColumn[];
  /** Whether its target has a primary key (every key column NOT NULL): it can be a source. */
  readable: boolean;
  /** Ends with `WITHOUT SOURCE INDEX`. */
  withoutSourceIndex: boolean;
  /** Written in the AS form (`TRANSFORM x AS SELECT …`), with a trailing ORDER BY or not. */
  form: 'from' | 'as' | 'as-ordered';
  /** What it is made of, for the generator's coverage (`constructsOf`). */
  constructs: string[];
  /**
   * The engine refuses it (`validation`, its message matching this): the case checks the
   * refusal, and neither defines nor compares it.
   */
  refused?: string;
  /** The AS form's WITH queries (`w1 AS (SELECT …)`), tables named `«a»`. */
  with?: string;
  /**
   * `SELECT DISTINCT ON (on) … ORDER BY orderBy` (ADR 0065): `select` follows the DISTINCT
   * ON, `where` and then the ORDER BY follow FROM.
   */
  distinctOn?: { on: string; orderBy: string };
  /**
   * INTERSECT, EXCEPT or set operators of several kinds at the top (ADR 0072, 0073): the
   * whole statement after `SELECT`, tables named `«a»`; `select` holds its first branch's items.
   */
  setop?: string;
  /** A UNION at the top: its second branch's SELECT list, FROM and WHERE (the first is this). */
  union?: {
    all: boolean;
    list: string;
    from: string;
    where: string | null;
    /** Each branch's table's key, as a UNION ALL's target identifies its rows. */
    keys: [string, string];
  };
}

function tableSource(
  schema: Schema,
  index: number,
  join: Source['join'],
  alias = schema.tables[index]!.name,
): Source {
  const table = schema.tables[index]!;
  const nullable = join?.left ?? false;
  const scope = (c: Column): ScopeColumn => ({
    alias,
    name: c.name,
    type: c.type,
    nullable: nullable || !c.notNull,
  });
  return {
    alias,
    name: table.name,
    keys: keyColumns(table).map(scope),
    columns: columnsOf(schema, table).map(scope),
    join,
  };
}

/** Pairs of columns of one type, one of `x`, one of `y`, for a join on values. */
function valuePairs(x: Source, y: Source): Array<readonly [string, string]> {
  return x.columns.flatMap((a) =>
    y.columns.filter((b) => b.type === a.type).map((b) => [col(a), col(b)] as const),
  );
}

/** The rest of a join's ON: a predicate on the joined side, two columns compared. */
function extraConditions(sources: Source[], source: Source, j: JoinChoice, conditions: string[]) {
  source.constructs ??= [];
  if (j.extra) {
    conditions.push(predicate([source], j.extra));
    source.constructs.push('ON with a predicate');
  }
  if (j.cross) {
    conditions.push(
      crossPredicate([...sources, source], j.cross, at(source.columns, j.cross.column)),
    );
    source.constructs.push('ON comparing two columns');
  }
  if (conditions.length > 2) source.constructs.push('ON of three conditions or more');
  source.join = { left: j.left, on: conditions.join(' AND ') };
}

/**
 * Which outer joins a FROM may have as its first join: none, RIGHT only (a semi-join,
 * scalar subquery or aggregate around it), or FULL too (a projection or SELECT DISTINCT:
 * a FULL JOIN is a UNION ALL, ADR 0066).
 */
type Outer = 'none' | 'right' | 'full';

function fromSources(
  schema: Schema,
  choice: TransformChoice,
  outer: Outer = 'none',
  later = false,
): Source[] {
  const tables = schema.tables.map((_, i) => i);
  const driving = tables.splice(choice.driving % tables.length, 1)[0]!;
  const sources = [tableSource(schema, driving, null)];
  const indexes = [driving];
  for (const j of choice.joins) {
    // A table already in FROM joined again (a self-join), under an alias of its own; or
    // one not yet there.
    if (tables.length === 0 && j.again === null) break;
    const again = j.again !== null || tables.length === 0;
    const joined = again
      ? at(indexes, j.again ?? 0)
      : tables.splice(j.table % tables.length, 1)[0]!;
    const toSource = at(sources, j.to);
    const toIndex = at(indexes, j.to);
    const to = schema.tables[toIndex]!;
    const table = schema.tables[joined]!;
    const copies = indexes.filter((i) => i === joined).length;
    const alias = copies ? `${table.name}${copies + 1}` : table.name;
    const source = tableSource(schema, joined, { left: j.left, on: '' }, alias);
    source.constructs = again ? ['self-join'] : [];
    // Columns of one type on either side, for a join on values rather than keys (always,
    // between two copies of one table: a table holds no reference to itself).
    const pairs = valuePairs(source, toSource);
    const byValues = pairs.length > 0 && (j.values !== null || joined === toIndex);
    const [left, right] = byValues
      ? [[at(pairs, j.values ?? 0)[0]], [at(pairs, j.values ?? 0)[1]]]
      : j.reverse
        ? [
            refColumns(to).map((c) => `${alias}.${c.name}`),
            keyColumns(to).map((c) => `${toSource.alias}.${c.name}`),
          ]
        : [
            keyColumns(table).map((c) => `${alias}.${c.name}`),
            refColumns(table).map((c) => `${toSource.alias}.${c.name}`),
          ];
    if (byValues) source.constructs.push('join on values');
    const conditions = left.map((l, i) => `${l} = ${right[i]}`);
    // A RIGHT or FULL JOIN after a LEFT JOIN (ADR 0073; `later`: under an aggregate or
    // DISTINCT only, whose target has no key of the compiled union's).
    const afterLeft =
      later &&
      sources.length > 1 &&
      !sources.some((s) => s.join?.outer) &&
      sources.some((s) => s.join?.left);
    const kind =
      (sources.length > 1 && !afterLeft) || outer === 'none'
        ? undefined
        : j.outer === 0
          ? 'right'
          : j.outer === 1 && (outer === 'full' || afterLeft)
            ? 'full'
            : undefined;
    extraConditions(sources, source, kind ? { ...j, left: true } : j, conditions);
    if (kind) {
      source.join = { ...source.join!, outer: kind, ...(afterLeft ? { later: true } : {}) };
      source.constructs.push(
        `${kind === 'right' ? 'RIGHT JOIN' : 'FULL JOIN'}${afterLeft ? ' after a LEFT JOIN' : ''}`,
      );
      const nullable = (x: Source): Source => ({
        ...x,
        keys: x.keys.map((c) => ({ ...c, nullable: true })),
        columns: x.columns.map((c) => ({ ...c, nullable: true })),
      });
      if (afterLeft) {
        // Written as it reads (`… LEFT JOIN b ON … RIGHT JOIN c ON …`): the sources before
        // it are NULL where only its table has a row; a FULL JOIN's table where only they do.
        for (const [i, x] of sources.entries()) sources[i] = nullable(x);
        if (kind === 'full') Object.assign(source, nullable(source));
        else {
          source.keys = source.keys.map((c) => ({ ...c, nullable: false }));
          source.columns = tableSource(schema, joined, null, alias).columns;
        }
      } else if (kind === 'full') {
        // A FULL JOIN's first table is NULL where only the second has a row.
        sources[0] = nullable(sources[0]!);
      }
    }
    sources.push(source);
    indexes.push(joined);
  }
  return sources;
}

/** A query (SELECT list, WHERE, GROUP BY, HAVING, implicit keys) over `sources`. */
function readQuery(
  name: string,
  sources: Source[],
  choice: QueryChoice,
  where: string[],
  anti = false,
): Transform {
  // What makes an ordered aggregate's order total: every key; for a source without one (a
  // UNION ALL subquery), every column by its image (duplicates are alike).
  const keys = sources
    .flatMap((s) =>
      s.keys.length ? s.keys.map(col) : s.columns.map((c) => `${col(c)}::text COLLATE "C"`),
    )
    .join(', ');
  const used = new Set<string>();
  const select: Transform['select'] = [];
  const groupBy: string[] = [];
  const implicit: string[] = [];
  const targetKeys: ScopeColumn[] = [];
  /** For GROUP BY: every grouping expression is a bare column (the key's are known). */
  let keyed = false;
  const constructs: string[] = [];
  const filter = choice.where ? [predicate(sources, choice.where)] : [];
  const also = choice.alsoWhere;
  if (also) {
    const second = also.cross ? crossPredicate(sources, also.pick) : predicate(sources, also.pick);
    if (also.cross) constructs.push('WHERE comparing two columns');
    if (also.or && filter.length) {
      filter[0] = `(${filter[0]}) OR (${second})`;
      constructs.push('WHERE with OR');
    } else filter.push(second);
  }
  if (where.length + filter.length > 1) constructs.push('WHERE of two conditions or more');
  if (choice.kind === 'rows') {
    choice.items.forEach((item, i) => {
      const e = valueExpr(sources, item.pick);
      const other = item.with ? valueExpr(sources, item.with) : null;
      const made = other ? combined(e, other) : e;
      if (other) {
        const aliases = new Set([e.sql, other.sql].map((x) => /\b(\w+)\./.exec(x)?.[1]));
        constructs.push(
          aliases.size > 1 ? 'expression of two tables' : 'expression of two columns',
        );
      }
      select.push({ ...made, name: itemName(`o${i + 1}`, item.name, used) });
    });
    // The key: each source's key columns, a bare SELECT item of it when there is one, else
    // an implicit column named after it, or alias_column when that name is taken
    // (_analyze_transform in 0005_transform_analysis.sql).
    const taken = new Set([...select.map((s) => s.name), ...SYSTEM_COLUMNS]);
    const keyItems = new Set<number>();
    for (const source of sources) {
      for (const k of source.keys) {
        const found = select.findIndex(
          (s, i) => !keyItems.has(i) && s.bare?.alias === k.alias && s.bare.name === k.name,
        );
        if (found >= 0) {
          keyItems.add(found);
          targetKeys.push({ ...k, alias: '', name: select[found]!.name });
          continue;
        }
        let keyName = k.name;
        if (taken.has(keyName)) keyName = `${k.alias}_${k.name}`;
        if (taken.has(keyName)) throw new Error(`the generator took the name ${keyName}`);
        taken.add(keyName);
        implicit.push(`${col(k)} AS ${keyName}`);
        targetKeys.push({ ...k, alias: '', name: keyName });
      }
    }
  } else {
    const seen = new Set<string>();
    const distinct = choice.kind === 'distinct';
    const groups = choice.kind === 'groups' || distinct ? choice.groups : [];
    groups.forEach((g, i) => {
      const e = groupExpr(sources, g.pick);
      if (seen.has(e.sql)) return;
      seen.add(e.sql);
      groupBy.push(e.sql);
      // SELECT DISTINCT selects every expression it is keyed by.
      if (g.selected || !e.bare || distinct) {
        select.push({ ...e, name: itemName(`g${i + 1}`, g.name, used) });
      }
    });
    (distinct ? [] : choice.aggregates).forEach((a, i) => {
      const filterBy = a.filter ? ` FILTER (WHERE ${predicate(sources, a.filter)})` : '';
      if (a.filter && choice.delta) constructs.push('delta aggregate with FILTER');
      const made = aggregate(sources, a.pick, keys, choice.delta);
      const call = `${made.sql}${filterBy}`;
      select.push({
        sql: choice.delta ? deltaExpression(call, made.type, a.pick.column) : call,
        type: made.type,
        bare: null,
        name: itemName(`n${i + 1}`, a.name, used),
      });
    });
    // The key: the GROUP BY expressions, each the SELECT item that is it, or an implicit
    // column named after the bare column it is (alias_column when that name is taken).
    const taken = new Set([...select.map((s) => s.name), ...SYSTEM_COLUMNS]);
    for (const g of groupBy) {
      const bare = groups.map((x) => groupExpr(sources, x.pick)).find((e) => e.sql === g)!.bare;
      const item = select.find((s) => s.sql === g);
      if (item) {
        if (bare) targetKeys.push({ ...bare, alias: '', name: item.name });
        continue;
      }
      let keyName = bare!.name;
      if (taken.has(keyName)) keyName = `${bare!.alias}_${bare!.name}`;
      if (taken.has(keyName)) throw new Error(`the generator took the name ${keyName}`);
      taken.add(keyName);
      implicit.push(`${col(bare!)} AS ${keyName}`);
      targetKeys.push({ ...bare!, alias: '', name: keyName });
    }
    keyed = groupBy.length > 0 && targetKeys.length === groupBy.length;
  }
  const aggregates = choice.kind === 'groups' || choice.kind === 'total';
  return {
    name,
    kind: choice.kind,
    anti,
    sources,
    select,
    where: [...where, ...filter],
    groupBy,
    having: aggregates && choice.having ? having(sources, choice.having, choice.delta) : null,
    delta: aggregates && choice.delta,
    implicit,
    keys: targetKeys,
    // A target a chain can read has a primary key: every key column NOT NULL (source
    // keys outside LEFT JOINs; GROUP BY expressions that are bare NOT NULL columns).
    // A SELECT DISTINCT target is keyed by every column, NULLs included: by a unique
    // index, not a primary key.
    readable:
      choice.kind === 'distinct'
        ? false
        : aggregates
          ? keyed && targetKeys.every((k) => !k.nullable)
          : sources.every((s) => !s.join?.left),
    withoutSourceIndex: false,
    form: 'from',
    constructs,
  };
}

/** A transform (and the chain reading it, if any) read against `schema`. */
export function readTransform(schema: Schema, choice: TransformChoice, index: number): Transform[] {
  if (choice.view) {
    const view = readView(schema, choice, choice.view, index);
    if (view) return [view];
  }
  // A FULL JOIN only under a projection or SELECT DISTINCT (ADR 0066 refuses aggregates).
  const outer = choice.kind === 'rows' || choice.kind === 'distinct' ? 'full' : 'right';
  const readFrom = (later: boolean) => {
    const sources = fromSources(schema, choice, outer, later);
    const last = sources[sources.length - 1]!;
    const anti = Boolean(choice.anti && sources.length > 1 && last.join?.left && !last.join.outer);
    const where = anti ? [`${col(last.keys[0]!)} IS NULL`] : [];
    return { sources, transform: readQuery(`x${index}`, sources, choice, where, anti) };
  };
  const { sources, transform } = readFrom(choice.kind !== 'rows');
  transform.withoutSourceIndex = choice.options % 10 === 1;
  transform.form = (['from', 'as', 'as-ordered'] as const)[choice.form % 6] ?? 'from';
  // RIGHT and FULL joins are view SQL: the AS form.
  if (sources.some((s) => s.join?.outer)) {
    if (transform.form === 'from') transform.form = 'as';
    if (sources[1]?.join?.outer === 'full') fullJoinKey(transform);
  }
  const read = [transform];
  for (const [depth, query] of [choice.chain, choice.chain2].entries()) {
    const upstream = read[read.length - 1]!;
    if (!query || !upstream.readable) break;
    const sources = [upstreamSource(upstream)];
    const j = depth === 0 ? choice.chainJoin : null;
    if (j) {
      const table = tableSource(schema, j.table % schema.tables.length, { left: j.left, on: '' });
      const pairs = valuePairs(table, sources[0]!);
      if (pairs.length) {
        const [x, y] = at(pairs, j.values ?? 0);
        extraConditions(sources, table, j, [`${x} = ${y}`]);
        sources.push(table);
      }
    }
    // A key column would take a name the target has twice over (`q_id` when an item is
    // named `id` and the upstream has a `q_id`, say): the chain is read without its join,
    // or, failing that, not made.
    const attempt = (from: Source[]) => {
      try {
        return readQuery(`${upstream.name}c`, from, query, []);
      } catch (error) {
        if (!/took the name/.test((error as Error).message)) throw error;
        return null;
      }
    };
    const chain = attempt(sources) ?? (sources.length > 1 ? attempt(sources.slice(0, 1)) : null);
    if (!chain) break;
    read.push(chain);
  }
  return read;
}

/**
 * A projection over a FULL JOIN is keyed as the UNION ALL it is kept as (ADR 0066): its
 * branch (1: a row of the first table, 2: a row of the second no row of the first
 * matches) and the branch row's key as text, the first side's key first, then the other's
 * and the further joins'. The oracle states both columns from the FULL JOIN as written.
 */
function fullJoinKey(t: Transform): void {
  if (t.kind !== 'rows') return;
  const [first, second, ...rest] = t.sources.map((s) => s.keys.map(col));
  const matched = `${first![0]} IS NOT NULL`;
  const row = (keys: string[][]) => `ROW(${keys.flat().join(', ')})::text`;
  t.implicit = [
    `CASE WHEN ${matched} THEN 1 ELSE 2 END AS "trellis#branch"`,
    `CASE WHEN ${matched} THEN ${row([first!, second!, ...rest])} ELSE ${row([second!, first!, ...rest])} END AS "trellis#key"`,
  ];
  t.keys = [];
}

/**
 * A transform's target as a chain reads it (aliased q): its SELECT items (but arrays),
 * then the key columns the target added on its own; key columns are never NULL.
 */
function upstreamSource(transform: Transform): Source {
  const isKey = (name: string) => transform.keys.some((k) => k.name === name);
  return {
    alias: 'q',
    name: transform.name,
    keys: transform.keys.map((k) => ({ ...k, alias: 'q', nullable: false })),
    columns: [
      ...transform.select.flatMap((s) =>
        s.type === null
          ? []
          : [{ alias: 'q', name: s.name, type: s.type, nullable: !isKey(s.name) }],
      ),
      ...transform.keys
        .filter((k) => !transform.select.some((s) => s.name === k.name))
        .map((k) => ({ ...k, alias: 'q', nullable: false })),
    ],
    join: null,
  };
}

/**
 * What a transform is made of, as names the generator's coverage test looks for
 * (test/generator-coverage.test.ts): one per construct of the grammar it makes.
 */
export function constructsOf(t: Transform): string[] {
  const found = new Set<string>(t.constructs);
  if (!t.union && !t.distinctOn) found.add(`${t.kind === 'distinct' ? 'SELECT DISTINCT' : t.kind}`);
  const chain = t.sources[0]?.alias === 'q';
  if (chain) found.add('chain');
  for (const s of t.sources) {
    for (const c of s.constructs ?? []) found.add(c);
    if (s.join && !s.join.outer) found.add(s.join.left ? 'LEFT JOIN' : 'JOIN');
  }
  if (t.sources.length >= 3) found.add('three tables or more');
  if (t.sources.length >= 4) found.add('four tables or more');
  if (chain && t.sources.length > 1) found.add('chain joined with a table');
  if (chain && t.name.endsWith('cc')) found.add('chain of a chain');
  if (t.anti) found.add('anti-join');
  if (t.where.length) found.add('WHERE');
  if (t.having) found.add(t.delta ? 'delta HAVING' : 'HAVING');
  if (t.delta) found.add('delta aggregates');
  if (t.delta && /\b(sum|avg)\([a-z]+\.(num|dec)\d/.test(t.select.map((s) => s.sql).join())) {
    found.add('delta sum of numerics');
  }
  if (t.implicit.length) found.add('implicit key columns');
  if (t.withoutSourceIndex) found.add('WITHOUT SOURCE INDEX');
  if (t.form !== 'from') found.add('AS form');
  if (t.form === 'as-ordered') found.add('AS form with ORDER BY');
  return [...found];
}

/** What a transform is, in a few words (for the tests' progress lines): `x1: groups, left join of 3, having`. */
export function transformShape(t: Transform): string {
  const tags: string[] = t.union || t.distinctOn ? [] : [t.kind];
  for (const c of t.constructs) if (VIEW_CONSTRUCTS.test(c)) tags.push(c);
  if (t.sources[0]?.alias === 'q') tags.push('chain');
  const joins = t.sources.filter((s) => s.join);
  if (joins.length) {
    const kinds = [
      ...new Set(joins.map((s) => s.join!.outer ?? (s.join!.left ? 'left' : 'inner'))),
    ].join('+');
    tags.push(`${kinds} join of ${t.sources.length}`);
  }
  if (t.anti) tags.push('anti-join');
  if (t.where.length > (t.anti ? 1 : 0)) tags.push('where');
  if (t.having) tags.push('having');
  if (t.delta) tags.push('delta aggregates');
  if (t.withoutSourceIndex) tags.push('without source index');
  if (t.form !== 'from') tags.push('AS form');
  return `${t.name}: ${tags.join(', ')}`;
}

/** The Definition of a transform read against its schema, tables and targets named with `prefix`. */
export function definitionOf(t: Transform, prefix: string, naming: Naming = 'plain'): Definition {
  const items = t.sources.map((s) => {
    // A base table named as the case names them; an upstream target, plainly.
    const name = s.sql
      ? null
      : (TABLE_NAMES as readonly string[]).includes(s.name)
        ? tableSql(prefix, s.name, naming)
        : physical(prefix, s.name);
    return s.sql ?? `${name} ${s.alias}`;
  });
  const fromOf = (oracle: boolean) =>
    t.sources
      .map((s, i) => {
        const table = items[i]!;
        if (s.lateral) return oracle ? s.lateral.oracle : s.lateral.sql;
        if (s.join?.later)
          return `${s.join.outer === 'right' ? 'RIGHT' : 'FULL'} JOIN ${table} ON ${s.join.on}`;
        if (!s.join) return i === 0 && t.sources[1]?.join?.outer ? '' : table;
        // The first join written as RIGHT JOIN (its table first) or FULL JOIN.
        if (s.join.outer === 'right') return `${table} RIGHT JOIN ${items[0]} ON ${s.join.on}`;
        if (s.join.outer === 'full') return `${items[0]} FULL JOIN ${table} ON ${s.join.on}`;
        return `${s.join.left ? 'LEFT JOIN' : 'JOIN'} ${table} ON ${s.join.on}`;
      })
      .filter(Boolean)
      .join(' ');
  const from = fromOf(false);
  const oracleFrom = fromOf(true);
  // Subqueries name their tables `«a»`.
  const place = (text: string) => placeTables(text, (n) => tableSql(prefix, n, naming));
  if (t.setop) {
    // The statement split before its last branch's FROM (its tables are `«a» sq3`, no
    // subquery): the oracle runs it as written.
    const at = t.setop.lastIndexOf(' FROM ');
    return {
      target: physical(prefix, t.name),
      form: 'as',
      select: place(t.setop.slice('SELECT '.length, at)),
      from: place(t.setop.slice(at + ' FROM '.length)),
      ...(t.form === 'as-ordered' ? { orderBy: '1' } : {}),
      ...(t.withoutSourceIndex ? { options: 'WITHOUT SOURCE INDEX' } : {}),
    };
  }
  const select = t.select.map((s) => `${s.sql} AS ${s.name}`).join(', ');
  const where = t.where.map((w) => `(${w})`).join(' AND ');
  if (t.union) {
    // A UNION at the top, written as the oracle's parts: the first branch up to the second's
    // SELECT list is `select`, the second branch's FROM and WHERE are `from` and `where`.
    const u = t.union;
    const firstBranch = (list: string) =>
      place(
        `${list} FROM ${from}${where ? ` WHERE ${where}` : ''} UNION${u.all ? ' ALL' : ''} SELECT ${u.list}`,
      );
    // A UNION ALL's target identifies a row by its branch and its row's key (README): the
    // oracle's query states those columns, the statement does not.
    const hidden = (n: number) =>
      `${n} AS "trellis#branch", ROW(${u.keys[n - 1]})::text AS "trellis#key"`;
    return {
      target: physical(prefix, t.name),
      form: 'as',
      select: firstBranch(select),
      ...(u.all
        ? { oracleSelect: firstBranch(`${select}, ${hidden(1)}`), implicit: place(hidden(2)) }
        : {}),
      from: place(u.from),
      ...(u.where ? { where: place(u.where) } : {}),
      ...(t.form === 'as-ordered' ? { orderBy: '1' } : {}),
    };
  }
  if (t.distinctOn) {
    // The oracle's SELECT puts WHERE after FROM: here FROM carries WHERE and ORDER BY.
    const d = t.distinctOn;
    return {
      target: physical(prefix, t.name),
      form: 'as',
      select: place(`DISTINCT ON (${d.on}) ${select}`),
      from: place(`${from}${where ? ` WHERE ${where}` : ''} ORDER BY ${d.orderBy}`),
      ...(t.withoutSourceIndex ? { options: 'WITHOUT SOURCE INDEX' } : {}),
    };
  }
  return {
    target: physical(prefix, t.name),
    from: place(from),
    ...(oracleFrom !== from ? { oracleFrom: place(oracleFrom) } : {}),
    select: place(select),
    ...(t.where.length ? { where: place(where) } : {}),
    ...(t.with ? { with: place(t.with) } : {}),
    ...(t.groupBy.length && t.kind !== 'distinct' ? { groupBy: t.groupBy.join(', ') } : {}),
    ...(t.having ? { having: place(t.having) } : {}),
    ...(t.implicit.length ? { implicit: place(t.implicit.join(', ')) } : {}),
    ...(t.kind === 'distinct' ? { distinct: true } : {}),
    ...(t.withoutSourceIndex ? { options: 'WITHOUT SOURCE INDEX' } : {}),
    ...(t.form !== 'from' ? { form: 'as' as const } : {}),
    ...(t.form === 'as-ordered' ? { orderBy: '1' } : {}),
  };
}

/**
 * `arb`'s value one time in `oneIn`, else null (fast-check's `option` is the other way
 * round: null one time in `freq`), shrinking to null.
 */
export function sometimes<T>(arb: fc.Arbitrary<T>, oneIn: number): fc.Arbitrary<T | null> {
  return fc.oneof(
    { withCrossShrink: true },
    { weight: oneIn - 1, arbitrary: fc.constant(null) },
    { weight: 1, arbitrary: arb },
  );
}

const pickArb: fc.Arbitrary<Pick> = fc.record({
  source: fc.nat(5),
  column: fc.nat(20),
  template: fc.nat(20),
});

const queryArb = (kinds: Array<QueryChoice['kind']>): fc.Arbitrary<QueryChoice> =>
  fc.record({
    kind: fc.constantFrom(...kinds),
    items: fc.array(fc.record({ pick: pickArb, name: fc.nat(15), with: sometimes(pickArb, 6) }), {
      minLength: 1,
      maxLength: 4,
    }),
    where: fc.option(pickArb, { freq: 2 }),
    alsoWhere: sometimes(fc.record({ pick: pickArb, or: fc.boolean(), cross: fc.boolean() }), 4),
    groups: fc.array(fc.record({ pick: pickArb, selected: fc.boolean(), name: fc.nat(15) }), {
      minLength: 1,
      maxLength: 2,
    }),
    aggregates: fc.array(
      fc.record({ pick: pickArb, filter: fc.option(pickArb, { freq: 4 }), name: fc.nat(15) }),
      { minLength: 1, maxLength: 4 },
    ),
    having: fc.option(pickArb, { freq: 3 }),
    delta: fc.boolean(),
  });

const joinArb: fc.Arbitrary<JoinChoice> = fc.record({
  table: fc.nat(5),
  left: fc.boolean(),
  reverse: fc.boolean(),
  to: fc.nat(5),
  values: fc.option(fc.nat(40), { freq: 3 }),
  extra: fc.option(pickArb, { freq: 2 }),
  cross: sometimes(pickArb, 5),
  again: sometimes(fc.nat(3), 6),
  outer: fc.nat(5),
});

/*
 * View SQL (README, Transforms: the AS form's subqueries, ADRs 0056 to 0059): a transform
 * in three drawn (`viewChoiceArb`) is written as a view's SQL with one of these, over the
 * schema's tables, and compared with the statement as written, run by Postgres. Each
 * subquery names its tables `«a»` (definitionOf places them) and aliases them `sq`, `sq2`.
 *
 * Only what Postgres computes deterministically, as above: a subquery's key (a GROUP BY
 * column, a UNION's columns, a correlation column the engine keys a part by) is a column
 * of a type whose equal values have one image; nothing else is restricted beyond what
 * README says the engine refuses.
 */

export interface ViewChoice {
  /** Which form (`VIEW_KINDS`, modulo). */
  kind: number;
  /** The subquery's table, and a UNION's second branch's. */
  table: number;
  table2: number;
  /** The subquery's column (grouped by, correlated on, aggregated), and the outer one. */
  pick: Pick;
  /** More columns of the subquery's SELECT list (or a UNION's). */
  more: number[];
  /** A predicate inside the subquery, on its table. */
  filter: Pick | null;
  /** Which variant: WITH or derived table, EXISTS or IN, correlated or not, where... */
  variant: number;
  /**
   * A semi- or anti-join: NOT IN and <> ALL left over nullable values (no `IS NOT NULL`
   * added), and the predicate as a term of an OR with this one on the outer sources.
   */
  nulls: boolean;
  or: Pick | null;
}

/** The constructs of view SQL, as the progress lines name them (`transformShape`). */
const VIEW_CONSTRUCTS =
  /subquery|WITH|UNION|EXISTS|IN \(|ANY|ALL \(|DISTINCT ON|top-N|NULLs|OR|LATERAL|INTERSECT|EXCEPT|after a LEFT|refused/;

const VIEW_KINDS = [
  'derived',
  'derived UNION ALL',
  'derived UNION',
  'semi',
  'scalar',
  'UNION',
  'derived top-N',
  'semi',
  'DISTINCT ON',
  'LATERAL',
  'set operation',
  'derived set operation',
  'derived top-N of a subquery',
  'scalar',
  'LATERAL',
];

/**
 * `TRELLIS_TEST_GEN_FOCUS=LATERAL,set operation,…`: every transform written as view SQL of
 * one of these kinds (of `VIEW_KINDS`), for runs hunting in a part of the grammar (a knob
 * kept out of the suite: test/README.md).
 */
const FOCUS: string[] | null = (() => {
  const value = process.env.TRELLIS_TEST_GEN_FOCUS;
  if (!value) return null;
  const kinds = value.split(',').map((k) => k.trim());
  const unknown = kinds.filter((k) => !VIEW_KINDS.includes(k));
  if (unknown.length)
    throw new Error(`TRELLIS_TEST_GEN_FOCUS names no view kind: ${unknown.join(', ')}`);
  return kinds;
})();

/**
 * Set operations (ADR 0072, 0073) of two or three branches, as written (SQL's precedence:
 * INTERSECT binds tighter, brackets where written), with the name the coverage test knows
 * them by. At the top, only those whose outermost operator is distinct (a target of distinct
 * rows keyed by every column: ADR 0072's form); an ALL operator outermost (its copies keyed
 * by columns the statement does not state) only in a subquery, read by an aggregate.
 */
type SetShape = [name: string, branches: 2 | 3, text: (b: string[]) => string];
const TOP_SETOPS: SetShape[] = [
  ['INTERSECT', 2, ([a, b]) => `${a} INTERSECT ${b}`],
  ['EXCEPT', 2, ([a, b]) => `${a} EXCEPT ${b}`],
  ['UNION and INTERSECT', 3, ([a, b, c]) => `${a} UNION ${b} INTERSECT ${c}`],
  [
    'EXCEPT of a bracketed INTERSECT ALL',
    3,
    ([a, b, c]) => `${a} EXCEPT (${b} INTERSECT ALL ${c})`,
  ],
  ['UNION ALL then EXCEPT', 3, ([a, b, c]) => `${a} UNION ALL ${b} EXCEPT ${c}`],
  [
    'INTERSECT of a bracketed EXCEPT ALL',
    3,
    ([a, b, c]) => `${a} INTERSECT (${b} EXCEPT ALL ${c})`,
  ],
];
const SUB_SETOPS: SetShape[] = [
  ['INTERSECT in a subquery', 2, ([a, b]) => `${a} INTERSECT ${b}`],
  ['INTERSECT ALL in a subquery', 2, ([a, b]) => `${a} INTERSECT ALL ${b}`],
  ['EXCEPT in a subquery', 2, ([a, b]) => `${a} EXCEPT ${b}`],
  ['EXCEPT ALL in a subquery', 2, ([a, b]) => `${a} EXCEPT ALL ${b}`],
  ['mixed set operators in a subquery', 3, ([a, b, c]) => `${a} UNION ALL (${b} EXCEPT ${c})`],
  ['mixed set operators in a subquery', 3, ([a, b, c]) => `${a} EXCEPT ALL ${b} INTERSECT ${c}`],
];

/**
 * The branches of a set operation: the first over `v.table` (columns of one image, of
 * `v.pick.column` and `v.more`), the others over `v.table2` and the table of
 * `v.pick.source`, each column with one of its type (from the first branch's table when
 * theirs has none), a predicate in the first and last. Each branch is `SELECT … FROM «a» sqN
 * [WHERE …]`, its columns named by the first (`u1`, …).
 */
function setBranches(
  schema: Schema,
  v: ViewChoice,
  count: 2 | 3,
  arrays = false,
): { branches: string[]; columns: ScopeColumn[]; refused: boolean } | null {
  const first = innerSource(schema, v.table, 'sq');
  const firsts = [...new Set([v.pick.column, ...v.more].map((m) => at(first.columns, m)))].filter(
    (c) => KEYABLE.has(c.type),
  );
  if (firsts.length === 0) return null;
  // An int[] column too (`arrays`, when the table has one): refused where the set operation
  // is kept as counts (ADR 0073: a row's values are held as `(array_agg(v))[1]`).
  const array = arrays ? first.columns.find((c) => c.type === 'int_array') : undefined;
  if (array) firsts.push(array);
  const columns = firsts.map((c, i) => derivedColumn(`u${i + 1}`, c.type, c.nullable));
  const where1 = v.filter ? ` WHERE ${predicate([first], v.filter)}` : '';
  const branches = [
    `SELECT ${firsts.map((c, i) => `${col(c)} AS u${i + 1}`).join(', ')} FROM ${fromItem(first)}${where1}`,
  ];
  for (const [i, table] of [v.table2, v.pick.source].slice(0, count - 1).entries()) {
    const alias = `sq${i + 2}`;
    let other = innerSource(schema, table, alias);
    const matches = (c: ScopeColumn, s: Source) => s.columns.filter((o) => o.type === c.type);
    if (firsts.some((c) => matches(c, other).length === 0))
      other = innerSource(schema, v.table, alias);
    const picked = firsts.map((c, j) => at(matches(c, other), v.more[j] ?? v.pick.template + i));
    picked.forEach((c, j) => {
      if (c.nullable) columns[j] = { ...columns[j]!, nullable: true };
    });
    const where = i === count - 2 && v.or ? ` WHERE ${predicate([other], v.or)}` : '';
    branches.push(`SELECT ${branchList(picked)} FROM ${fromItem(other)}${where}`);
  }
  return { branches, columns, refused: array !== undefined };
}

/**
 * INTERSECT, EXCEPT or set operators of several kinds at the top (ADR 0072, 0073), their
 * outermost operator distinct: a target of distinct rows, keyed by every column.
 */
function topSetop(schema: Schema, v: ViewChoice, name: string): Transform | null {
  const [shape, count, text] = at(TOP_SETOPS, v.variant);
  const made = setBranches(schema, v, count);
  if (!made) return null;
  return {
    name,
    kind: 'distinct',
    anti: false,
    sources: [],
    select: made.columns.map((c) => ({ sql: c.name, name: c.name, type: c.type, bare: null })),
    where: [],
    groupBy: [],
    having: null,
    delta: false,
    implicit: [],
    keys: [],
    readable: false,
    withoutSourceIndex: false,
    form: 'as',
    constructs: [shape, ...(count === 3 ? ['set operators of three branches'] : [])],
    setop: text(made.branches),
  };
}

/**
 * CROSS JOIN LATERAL over `unnest` of an int[] column, or `jsonb_array_elements[_text]` of
 * a jsonb one (of an array only: a scalar or object raises), of any source in the drawn FROM
 * (ADR 0071), its elements `lt.el`, its position `lt.ordinality` (written WITH ORDINALITY,
 * or not: the target adds it, the oracle's FROM writes it). Under an aggregate the position
 * is always written (ordered aggregates order by every key, the position among them).
 */
function lateralSource(sources: Source[], v: ViewChoice, written: boolean): Source | null {
  const arrays = sources.flatMap((s) =>
    s.columns.filter((c) => c.type === 'int_array' || c.type === 'jsonb'),
  );
  if (arrays.length === 0) return null;
  const c = at(arrays, v.pick.column);
  const [call, type, nullable]: [string, ColumnType, boolean] =
    c.type === 'int_array'
      ? [`unnest(${col(c)})`, 'int', true]
      : (() => {
          const arg = `CASE WHEN jsonb_typeof(${col(c)}) = 'array' THEN ${col(c)} END`;
          return v.pick.template % 2 === 0
            ? [`jsonb_array_elements(${arg})`, 'jsonb', false]
            : [`jsonb_array_elements_text(${arg})`, 'text', true];
        })();
  const position: ScopeColumn = {
    alias: 'lt',
    name: 'ordinality',
    type: 'bigint',
    nullable: false,
  };
  const el: ScopeColumn = { alias: 'lt', name: 'el', type, nullable };
  const oracle = `CROSS JOIN LATERAL ${call} WITH ORDINALITY AS lt(el, ordinality)`;
  return {
    alias: 'lt',
    name: 'lt',
    keys: [position],
    columns: written ? [el, position] : [el],
    join: null,
    lateral: { sql: written ? oracle : `CROSS JOIN LATERAL ${call} AS lt(el)`, oracle },
    constructs: [
      // jsonb_array_elements and its _text form under one name (each drawn as often).
      c.type === 'int_array'
        ? 'CROSS JOIN LATERAL unnest'
        : 'CROSS JOIN LATERAL jsonb_array_elements',
      ...(written ? ['LATERAL WITH ORDINALITY'] : []),
    ],
  };
}

/** Types whose equal values have one image: what a subquery may be keyed by here. */
const KEYABLE: ReadonlySet<ColumnType> = new Set([
  'int',
  'bigint',
  'text',
  'boolean',
  'date',
  'timestamp',
  'uuid',
]);

/** A table read by a subquery, under `alias`. */
function innerSource(schema: Schema, index: number, alias: string): Source {
  return tableSource(schema, index % schema.tables.length, null, alias);
}

const fromItem = (s: Source) => `«${s.name}» ${s.alias}`;

/**
 * A UNION's second SELECT list: its columns bare, one perhaps there twice (the union's
 * columns take the first branch's names; view-sql-regressions.test.ts).
 */
function branchList(columns: ScopeColumn[]): string {
  return columns.map(col).join(', ');
}

/** Pairs of an inner column (kept by `keep`) and an outer one of its type. */
function pairsOf(
  inner: Source,
  outer: Source[],
  keep: (c: ScopeColumn) => boolean,
): Array<readonly [ScopeColumn, ScopeColumn]> {
  return inner.columns
    .filter(keep)
    .flatMap((a) =>
      outer.flatMap((s) => s.columns.filter((b) => b.type === a.type).map((b) => [a, b] as const)),
    );
}

const derivedColumn = (name: string, type: ColumnType, nullable: boolean): ScopeColumn => ({
  alias: 'dt',
  name,
  type,
  nullable,
});

/**
 * A subquery in FROM (derived table or WITH query, `variant`'s second bit) aliased `dt`: a
 * GROUP BY of a NOT NULL column with aggregates, a projection of a table (keyed by its
 * key), a UNION ALL of two tables' columns (no key: read by an aggregate only) or a UNION
 * of NOT NULL columns (keyed by every column).
 */
function derivedSource(
  schema: Schema,
  v: ViewChoice,
  kind: string,
  delta: boolean,
): {
  source: Source;
  with: string | null;
  constructs: string[];
  /** A top-N's filter on its rank, for the WHERE around it. */
  rank: string | null;
  partWith: string | null;
  /** The engine refuses the statement (`Transform.refused`). */
  refused: string | null;
} | null {
  const inner = innerSource(schema, v.table, 'sq');
  let rank: string | null = null;
  /** A top-N's part as a WITH query (`w1`, read by the ranking). */
  let partWith: string | null = null;
  let refused: string | null = null;
  const where = v.filter ? ` WHERE ${predicate([inner], v.filter)}` : '';
  const items: string[] = [];
  const columns: ScopeColumn[] = [];
  const keys: ScopeColumn[] = [];
  const constructs: string[] = [];
  let body: string;
  if (kind === 'derived') {
    const groupable = inner.columns.filter((c) => !c.nullable && KEYABLE.has(c.type));
    if (v.variant % 2 === 0 && groupable.length) {
      const g = at(groupable, v.pick.column);
      items.push(`${col(g)} AS g1`, 'count(*) AS n');
      keys.push(derivedColumn('g1', g.type, false));
      columns.push(keys[0]!, derivedColumn('n', 'bigint', false));
      v.more.forEach((m, i) => {
        const pick = { source: 0, column: m, template: m >> 3 };
        const a = aggregate([inner], pick, inner.keys.map(col).join(', '), delta);
        if (a.type === null) return;
        items.push(`${a.sql} AS v${i + 1}`);
        columns.push(derivedColumn(`v${i + 1}`, a.type, true));
      });
      body = `SELECT ${items.join(', ')} FROM ${fromItem(inner)}${where} GROUP BY ${col(g)}`;
      constructs.push('subquery of a GROUP BY');
    } else {
      for (const k of inner.keys) {
        items.push(`${col(k)} AS ${k.name}`);
        keys.push(derivedColumn(k.name, k.type, false));
      }
      columns.push(...keys);
      v.more.forEach((m, i) => {
        const c = at(inner.columns, m);
        items.push(`${col(c)} AS v${i + 1}`);
        columns.push(derivedColumn(`v${i + 1}`, c.type, c.nullable));
      });
      body = `SELECT ${items.join(', ')} FROM ${fromItem(inner)}${where}`;
      constructs.push('subquery of a projection');
    }
  } else if (kind === 'derived top-N') {
    // Top-N per partition (ADR 0065): a ranking of the table's rows per NOT NULL column of
    // one image, filtered by the statement around it (`rank` below). row_number's order
    // ends with the key (so nothing ties); rank and dense_rank order by one column of one
    // image (their ties are the statement's own).
    // A column other than the key when there is one (a partition of one row ranks nothing).
    const parts = inner.columns.filter((c) => !c.nullable && KEYABLE.has(c.type));
    const others = parts.filter((c) => !inner.keys.includes(c));
    if (parts.length === 0) return null;
    const part = at(others.length ? others : parts, v.pick.column);
    const ranking = at(['row_number', 'rank', 'dense_rank'], v.variant);
    const orderable =
      ranking === 'row_number' ? inner.columns : inner.columns.filter((c) => KEYABLE.has(c.type));
    if (orderable.length === 0) return null;
    const order = at(orderable, v.pick.template);
    const desc = (v.variant >> 2) % 2 === 1 ? ' DESC' : '';
    const tiebreak = ranking === 'row_number' ? `, ${inner.keys.map(col).join(', ')}` : '';
    for (const k of inner.keys) {
      items.push(`${col(k)} AS ${k.name}`);
      keys.push(derivedColumn(k.name, k.type, false));
    }
    columns.push(...keys);
    items.push(`${col(part)} AS p1`);
    columns.push(derivedColumn('p1', part.type, false));
    v.more.forEach((m, i) => {
      const c = at(inner.columns, m);
      items.push(`${col(c)} AS v${i + 1}`);
      columns.push(derivedColumn(`v${i + 1}`, c.type, c.nullable));
    });
    items.push(
      `${ranking}() OVER (PARTITION BY ${col(part)} ORDER BY ${col(order)}${desc}${tiebreak}) AS rn`,
    );
    columns.push(derivedColumn('rn', 'bigint', false));
    body = `SELECT ${items.join(', ')} FROM ${fromItem(inner)}${where}`;
    constructs.push(ranking === 'row_number' ? 'top-N by row_number()' : `top-N by ${ranking}()`);
    rank = `dt.rn ${at(['<= 1', '<= 2', '<= 3', '= 1', '< 3'], v.variant >> 3)}`;
  } else if (kind === 'derived set operation') {
    // INTERSECT, EXCEPT (ALL or not) or mixed operators in a subquery (ADR 0073: kept as
    // counts, whatever NULLs): no key of the statement's, read by an aggregate or DISTINCT.
    const [shape, count, text] = at(SUB_SETOPS, v.variant);
    // One in four over an int[] column as well, which the engine refuses.
    const made = setBranches(schema, v, count, v.nulls && (v.variant >> 3) % 2 === 1);
    if (!made) return null;
    columns.push(...made.columns);
    body = text(made.branches);
    constructs.push(shape);
    if (made.refused) {
      constructs.push('refused: an array column in a set operation');
      refused = 'a column of an array type .* is not supported';
    }
  } else if (kind === 'derived top-N of a subquery') {
    // Top-N over a subquery or WITH query (ADR 0073): a part (a GROUP BY of one or two NOT
    // NULL columns, or a projection of a table keyed by its key) ranked per partition, a
    // bare column copied from a NOT NULL column of the table (NOT NULL on the part).
    const notNull = inner.columns.filter((c) => !c.nullable && KEYABLE.has(c.type));
    if (notNull.length === 0) return null;
    const partItems: string[] = [];
    const partColumns: ScopeColumn[] = [];
    const partKeys: ScopeColumn[] = [];
    const pc = (n: string, type: ColumnType, nullable: boolean): ScopeColumn => ({
      alias: 'p',
      name: n,
      type,
      nullable,
    });
    let partBody: string;
    let partition: ScopeColumn;
    if (v.variant % 2 === 0) {
      const g = [...new Set([at(notNull, v.pick.column), at(notNull, v.pick.template)])];
      g.forEach((c, i) => {
        partItems.push(`${col(c)} AS p${i + 1}`);
        partKeys.push(pc(`p${i + 1}`, c.type, false));
      });
      partItems.push('count(*) AS n');
      partColumns.push(...partKeys, pc('n', 'bigint', false));
      const ints = inner.columns.filter((c) => c.type === 'int');
      if (ints.length) {
        partItems.push(`sum(${col(at(ints, v.pick.source))}) AS s`);
        partColumns.push(pc('s', 'bigint', true));
      }
      partBody = `SELECT ${partItems.join(', ')} FROM ${fromItem(inner)}${where} GROUP BY ${g.map(col).join(', ')}`;
      // Partitioned by the first group column; by the second (when there is one) ranks more.
      partition = partKeys[0]!;
      constructs.push('top-N of a GROUP BY subquery');
    } else {
      for (const k of inner.keys) {
        partItems.push(`${col(k)} AS ${k.name}`);
        partKeys.push(pc(k.name, k.type, false));
      }
      partColumns.push(...partKeys);
      const others = notNull.filter((c) => !inner.keys.includes(c));
      const p = at(others.length ? others : notNull, v.pick.column);
      partItems.push(`${col(p)} AS p1`);
      partColumns.push(pc('p1', p.type, false));
      partition = partColumns[partColumns.length - 1]!;
      v.more.forEach((m, i) => {
        const c = at(inner.columns, m);
        partItems.push(`${col(c)} AS v${i + 1}`);
        partColumns.push(pc(`v${i + 1}`, c.type, c.nullable));
      });
      partBody = `SELECT ${partItems.join(', ')} FROM ${fromItem(inner)}${where}`;
      constructs.push('top-N of a projection subquery');
    }
    const ranking = at(['row_number', 'rank', 'dense_rank'], v.variant >> 1);
    const orderable =
      ranking === 'row_number' ? partColumns : partColumns.filter((c) => KEYABLE.has(c.type));
    const order = at(orderable, v.pick.template);
    const desc = (v.variant >> 3) % 2 === 1 ? ' DESC' : '';
    // row_number's ties broken by the part's key, as the engine breaks them (ADR 0073).
    const tiebreak = ranking === 'row_number' ? `, ${partKeys.map(col).join(', ')}` : '';
    for (const c of partColumns) {
      items.push(col(c));
      columns.push(derivedColumn(c.name, c.type, c.nullable));
    }
    keys.push(...partKeys.map((k) => derivedColumn(k.name, k.type, false)));
    items.push(
      `${ranking}() OVER (PARTITION BY ${col(partition)} ORDER BY ${col(order)}${desc}${tiebreak}) AS rn`,
    );
    columns.push(derivedColumn('rn', 'bigint', false));
    const asWithPart = (v.variant >> 4) % 2 === 1;
    partWith = asWithPart ? `w1 AS (${partBody})` : null;
    body = `SELECT ${items.join(', ')} FROM ${asWithPart ? 'w1 p' : `(${partBody}) AS p`}`;
    constructs.push(
      ranking === 'row_number' ? 'top-N by row_number()' : `top-N by ${ranking}()`,
      `top-N over a ${asWithPart ? 'WITH query' : 'subquery'}`,
    );
    rank = `dt.rn ${at(['<= 1', '<= 2', '< 3', '= 1'], v.variant >> 5)}`;
  } else {
    // A UNION: each column of the first branch with one of its type in the second (from
    // the first branch's table when the second's has none); UNION's NOT NULL and keyable.
    const distinct = kind === 'derived UNION';
    // A UNION's columns are its branches' keys (README: the statement around it reads it by
    // every column, which its branches' targets must hold NOT NULL: keys, count()).
    const pool = (s: Source) => (distinct ? s.keys.filter((k) => KEYABLE.has(k.type)) : s.columns);
    if (pool(inner).length === 0) return null;
    const firsts = [...new Set([v.pick.column, ...v.more].map((m) => at(pool(inner), m)))];
    let second = innerSource(schema, v.table2, 'sq2');
    const matches = (c: ScopeColumn, s: Source) => pool(s).filter((o) => o.type === c.type);
    if (firsts.some((c) => matches(c, second).length === 0)) {
      second = innerSource(schema, v.table, 'sq2');
    }
    const seconds = firsts.map((c, i) => at(matches(c, second), v.more[i] ?? v.pick.template));
    firsts.forEach((c, i) => {
      items.push(`${col(c)} AS u${i + 1}`);
      const nullable = c.nullable || seconds[i]!.nullable;
      columns.push(derivedColumn(`u${i + 1}`, c.type, nullable));
    });
    if (distinct) keys.push(...columns);
    const where2 = v.filter ? ` WHERE ${predicate([second], v.filter)}` : '';
    body =
      `SELECT ${items.join(', ')} FROM ${fromItem(inner)}${where} ` +
      `UNION${distinct ? '' : ' ALL'} SELECT ${branchList(seconds)} FROM ${fromItem(second)}${where2}`;
    constructs.push(distinct ? 'UNION in a subquery' : 'UNION ALL in a subquery');
  }
  // Not a top-N in a WITH query (ADR 0065 refuses it).
  const asWith = (v.variant >> 1) % 2 === 1 && rank === null;
  constructs.push(asWith ? 'WITH query' : 'derived table');
  return {
    rank,
    partWith,
    refused,
    source: {
      alias: 'dt',
      name: 'dt',
      keys,
      columns,
      join: null,
      sql: asWith ? 'w1 dt' : `(${body}) AS dt`,
    },
    with: asWith ? `w1 AS (${body})` : null,
    constructs,
  };
}

/**
 * A semi- or anti-join on the picked columns, AND-ed into WHERE, or OR-ed with a predicate
 * on the outer sources (`v.or`). NOT IN and <> ALL over nullable values either as they
 * are (SQL's NULL answers, `v.nulls`) or with `IS NOT NULL` on each nullable side.
 */
function semiJoin(
  schema: Schema,
  sources: Source[],
  v: ViewChoice,
): { where: string[]; constructs: string[] } | null {
  const inner = innerSource(schema, v.table, 'sq');
  const pairs = pairsOf(inner, sources, () => true);
  if (pairs.length === 0) return null;
  const [x, y] = at(pairs, v.pick.column);
  const p = v.filter ? predicate([inner], v.filter) : null;
  const from = fromItem(inner);
  // NOT IN and <> ALL twice as often: their NULL answers are the hardest to keep.
  const form = at([0, 1, 2, 3, 4, 5, 4, 5], v.variant);
  const constructs: string[] = [];
  const or = (condition: string): string => {
    if (!v.or) return condition;
    constructs.push('subquery predicate under OR');
    return `(${condition}) OR (${predicate(sources, v.or)})`;
  };
  if (form < 2) {
    const not = form === 1 ? 'NOT ' : '';
    constructs.push(`${not}EXISTS`);
    return {
      where: [
        or(
          `${not}EXISTS (SELECT 1 FROM ${from} WHERE ${col(x)} = ${col(y)}${p ? ` AND ${p}` : ''})`,
        ),
      ],
      constructs,
    };
  }
  const spelling = ['IN', '= ANY', 'NOT IN', '<> ALL'][form - 2]!;
  const negated = form >= 4;
  constructs.push(`${spelling} (SELECT …)`);
  // NOT IN is TRUE, FALSE or NULL by SQL's rules over NULLs on either side (README); or,
  // with `IS NOT NULL` on each nullable side, TRUE or FALSE only.
  const guarded = negated && !v.nulls;
  if (negated && !guarded && (x.nullable || y.nullable)) constructs.push('NOT IN over NULLs');
  const conditions = [
    ...(guarded && x.nullable ? [`${col(x)} IS NOT NULL`] : []),
    ...(p ? [p] : []),
  ];
  const list = `SELECT ${col(x)} FROM ${from}${conditions.length ? ` WHERE ${conditions.join(' AND ')}` : ''}`;
  return {
    where: [
      ...(guarded && y.nullable ? [`${col(y)} IS NOT NULL`] : []),
      or(`${col(y)} ${spelling} (${list})`),
    ],
    constructs,
  };
}

/**
 * A scalar subquery (an aggregate of a table, correlated by one equality on a NOT NULL
 * column or not) in WHERE, the SELECT list or HAVING of `t`, which it changes; with the
 * column a projection's target adds for it (`"trellis#one"`, `"trellis#k1"`).
 */
function scalarSubquery(schema: Schema, t: Transform, v: ViewChoice): boolean {
  const inner = innerSource(schema, v.table, 'sq');
  const sources = t.sources;
  const pairs = pairsOf(inner, sources, (c) => !c.nullable && KEYABLE.has(c.type));
  let place = (['WHERE', 'SELECT', 'HAVING'] as const)[(v.variant >> 1) % 3]!;
  if (place === 'HAVING' && t.kind !== 'groups') place = 'WHERE';
  if (place === 'SELECT' && t.kind !== 'rows' && t.kind !== 'groups') place = 'WHERE';
  // Correlated only in WHERE, or the SELECT list of a projection (README).
  const correlated =
    v.variant % 2 === 1 && pairs.length > 0 && (place === 'WHERE' || t.kind === 'rows');
  const pair = correlated ? at(pairs, v.pick.column) : null;
  const conditions = [
    ...(pair ? [`${col(pair[0])} = ${col(pair[1])}`] : []),
    ...(v.filter ? [predicate([inner], v.filter)] : []),
  ];
  const ints = inner.columns.filter((c) => c.type === 'int' || c.type === 'bigint');
  const n = ints.length ? at(ints, v.pick.column) : null;
  const [aggregateSql, type]: [string, ColumnType] = (() => {
    switch (v.pick.template % 4) {
      case 1:
        return [`count(${col(at(inner.columns, v.pick.column))})`, 'bigint'];
      case 2:
        return n ? [`max(${col(n)})`, n.type] : ['count(*)', 'bigint'];
      case 3:
        return n
          ? [`sum(${col(n)})`, n.type === 'int' ? 'bigint' : 'numeric']
          : ['count(*)', 'bigint'];
      default:
        return ['count(*)', 'bigint'];
    }
  })();
  const where = conditions.length ? ` WHERE ${conditions.join(' AND ')}` : '';
  const sub = `(SELECT ${aggregateSql} FROM ${fromItem(inner)}${where})`;
  if (place === 'SELECT') {
    t.select.push({ sql: sub, name: 's1', type, bare: null });
  } else if (place === 'HAVING') {
    const cond = `count(*) * 4 >= ${sub}`;
    t.having = t.having ? `(${t.having}) AND ${cond}` : cond;
  } else {
    const outer = sources
      .flatMap((s) => s.columns)
      .filter((c) => c.type === 'int' || c.type === 'bigint');
    t.where.push(
      outer.length && (v.variant >> 3) % 2 === 1
        ? `${col(at(outer, v.pick.source))} <= ${sub}`
        : `${sub} > ${(v.variant >> 4) % 3}`,
    );
  }
  if (t.kind === 'rows') {
    t.implicit.push(
      pair
        ? `CASE WHEN EXISTS (SELECT 1 FROM ${fromItem(inner)}${where}) THEN ${col(pair[1])} END AS "trellis#k1"`
        : 'true AS "trellis#one"',
    );
  }
  t.constructs.push(`scalar subquery in ${place}`);
  if (pair) t.constructs.push('correlated scalar subquery');
  return true;
}

/**
 * A UNION (keyed by every column: keyable types) or UNION ALL (keyed by branch and row) of
 * two tables' columns at the top.
 */
function topUnion(
  schema: Schema,
  choice: TransformChoice,
  v: ViewChoice,
  name: string,
): Transform | null {
  const all = (v.variant >> 2) % 2 === 1;
  const first = innerSource(schema, v.table, schema.tables[v.table % schema.tables.length]!.name);
  const firsts = [...new Set([v.pick.column, ...v.more].map((m) => at(first.columns, m)))].filter(
    (c) => all || KEYABLE.has(c.type),
  );
  if (firsts.length === 0) return null;
  const index2 = v.table2 % schema.tables.length;
  let second = innerSource(schema, index2, schema.tables[index2]!.name);
  const matches = (c: ScopeColumn, s: Source) => s.columns.filter((o) => o.type === c.type);
  if (firsts.some((c) => matches(c, second).length === 0)) second = { ...first };
  const seconds = firsts.map((c, i) => at(matches(c, second), v.more[i] ?? v.pick.template));
  return {
    name,
    kind: 'distinct',
    anti: false,
    sources: [first],
    select: firsts.map((c, i) => ({ sql: col(c), name: `u${i + 1}`, type: c.type, bare: null })),
    where: v.filter ? [predicate([first], v.filter)] : [],
    groupBy: [],
    having: null,
    delta: false,
    implicit: [],
    keys: [],
    readable: false,
    withoutSourceIndex: false,
    form: choice.form % 2 ? 'as-ordered' : 'as',
    constructs: [all ? 'UNION ALL' : 'UNION'],
    union: {
      all,
      list: branchList(seconds),
      from: fromItem(second),
      where: choice.where ? predicate([second], choice.where) : null,
      keys: [first.keys.map(col).join(', '), second.keys.map(col).join(', ')],
    },
  };
}

/**
 * `SELECT DISTINCT ON (p) p, items … ORDER BY p, o [DESC], <every source's key>` over the
 * drawn FROM (ADR 0065): the first row of each partition, one by the order (the keys end
 * it, so nothing ties). The partition is a GROUP BY expression (equal values have one
 * image), selected first: the target's key. No item of an array type (ADR 0065 refuses it).
 */
function distinctOn(
  schema: Schema,
  choice: TransformChoice,
  v: ViewChoice,
  name: string,
): Transform {
  const sources = fromSources(schema, choice);
  const part = groupExpr(sources, v.pick);
  const used = new Set<string>(['g1']);
  const select: Transform['select'] = [{ ...part, name: 'g1' }];
  choice.items.forEach((item, i) => {
    const e = valueExpr(sources, item.pick);
    if (e.type === 'int_array') return;
    select.push({ ...e, name: itemName(`o${i + 1}`, item.name, used) });
  });
  const order = column(sources, v.filter ?? { ...v.pick, column: v.pick.template });
  const desc = v.variant % 2 === 1 ? ' DESC' : '';
  const keys = sources.flatMap((s) => s.keys.map(col));
  const where = choice.where ? [predicate(sources, choice.where)] : [];
  return {
    name,
    kind: 'rows',
    anti: false,
    sources,
    select,
    where,
    groupBy: [],
    having: null,
    delta: false,
    implicit: [],
    keys: [
      { ...(part.bare ?? { alias: '', nullable: true }), type: part.type, alias: '', name: 'g1' },
    ],
    readable: false,
    withoutSourceIndex: false,
    form: 'as',
    constructs: ['DISTINCT ON'],
    distinctOn: {
      on: part.sql,
      orderBy: `${part.sql}, ${col(order)}${desc}, ${keys.join(', ')}`,
    },
  };
}

/**
 * A transform written as view SQL (`choice.view`), or null when the schema has nothing
 * the drawn form needs (the transform is then read as if none was drawn).
 */
function readView(
  schema: Schema,
  choice: TransformChoice,
  v: ViewChoice,
  index: number,
): Transform | null {
  const name = `x${index}`;
  const kind = at(FOCUS ?? VIEW_KINDS, v.kind);
  let t: Transform;
  if (kind === 'UNION') {
    const u = topUnion(schema, choice, v, name);
    if (!u) return null;
    t = u;
  } else if (kind === 'DISTINCT ON') {
    t = distinctOn(schema, choice, v, name);
  } else if (kind === 'set operation') {
    const u = topSetop(schema, v, name);
    if (!u) return null;
    t = u;
  } else if (kind === 'LATERAL') {
    const sources = fromSources(schema, choice);
    const lateral = lateralSource(sources, v, choice.kind !== 'rows' || v.variant % 4 < 2);
    if (!lateral) return null;
    sources.push(lateral);
    t = readQuery(name, sources, choice, []);
    t.constructs.push(...(lateral.constructs ?? []));
    if (t.kind !== 'rows') {
      t.constructs.push(
        t.kind === 'distinct' ? 'LATERAL under DISTINCT' : 'LATERAL under an aggregate',
      );
    }
  } else if (kind.startsWith('derived')) {
    const derived = derivedSource(schema, v, kind, choice.delta);
    if (!derived) return null;
    const sources = [derived.source];
    const j = choice.joins[0];
    if (j) {
      const table = tableSource(schema, j.table % schema.tables.length, { left: j.left, on: '' });
      const pairs = valuePairs(table, derived.source);
      if (pairs.length) {
        const [x, y] = at(pairs, j.values ?? 0);
        extraConditions(sources, table, j, [`${x} = ${y}`]);
        sources.push(table);
        derived.constructs.push('subquery joined with a table');
      }
    }
    // A UNION ALL has no key: read by an aggregate (or DISTINCT) only.
    const query: QueryChoice =
      (kind === 'derived UNION ALL' || kind === 'derived set operation') && choice.kind === 'rows'
        ? { ...choice, kind: 'groups' }
        : choice;
    t = readQuery(name, sources, query, derived.rank ? [derived.rank] : []);
    if (derived.with ?? derived.partWith) t.with = (derived.with ?? derived.partWith)!;
    if (derived.refused) t.refused = derived.refused;
    t.constructs.push(...derived.constructs);
  } else {
    const sources = fromSources(schema, choice, 'right');
    const last = sources[sources.length - 1]!;
    const anti = Boolean(choice.anti && sources.length > 1 && last.join?.left);
    t = readQuery(name, sources, choice, anti ? [`${col(last.keys[0]!)} IS NULL`] : [], anti);
    if (kind === 'semi') {
      const semi = semiJoin(schema, sources, v);
      if (!semi) return null;
      t.where.push(...semi.where);
      t.constructs.push(...semi.constructs);
    } else {
      scalarSubquery(schema, t, v);
    }
  }
  // A DISTINCT ON's ORDER BY is its own.
  t.form = choice.form % 2 && !t.distinctOn ? 'as-ordered' : 'as';
  t.readable = false;
  t.withoutSourceIndex = choice.options % 10 === 1;
  t.constructs.push('view SQL');
  return t;
}

const viewChoiceArb: fc.Arbitrary<ViewChoice> = fc.record({
  kind: fc.nat(VIEW_KINDS.length - 1),
  table: fc.nat(5),
  table2: fc.nat(5),
  pick: fc.record({ source: fc.nat(5), column: fc.nat(20), template: fc.nat(20) }),
  more: fc.array(fc.nat(40), { maxLength: 2 }),
  filter: fc.option(fc.record({ source: fc.nat(5), column: fc.nat(20), template: fc.nat(20) }), {
    freq: 2,
  }),
  variant: fc.nat(63),
  nulls: fc.boolean(),
  or: sometimes(pickArb, 3),
});

export const transformChoiceArb: fc.Arbitrary<TransformChoice> = fc
  .record({
    query: queryArb(['rows', 'rows', 'rows', 'groups', 'groups', 'groups', 'total', 'distinct']),
    driving: fc.nat(5),
    joins: fc.array(joinArb, { maxLength: 3 }),
    anti: fc.boolean(),
    chain: fc.option(queryArb(['rows', 'groups']), { freq: 4 }),
    chainJoin: sometimes(joinArb, 4),
    chain2: sometimes(queryArb(['rows', 'groups']), 3),
    options: fc.nat(9),
    form: fc.nat(5),
    // View SQL for one transform in three (shrinks to none); every one under FOCUS.
    view: FOCUS ? viewChoiceArb : sometimes(viewChoiceArb, 3),
  })
  .map(({ query, ...rest }) => ({ ...query, ...rest }));
