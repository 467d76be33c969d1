/**
 * Renders drizzle expressions (columns, `sql` templates, operators such as `eq`) as text
 * for a TRANSFORM statement. A statement is stored and replayed as text (a migration
 * file, `<schema>.apply(text)`), so nothing can travel as a bind parameter: every value
 * becomes a literal in the text, quoted here rather than by drizzle's inliner, which
 * writes a Date as `Date#toString()` and refuses a bigint.
 *
 * Rendering also checks that every column and table an expression names is one of the
 * statement's sources: TypeScript checks bare columns, but a column inside a `sql`
 * template is only an object at run time.
 */
import {
  Column,
  is,
  Name,
  Param,
  Placeholder,
  SQL,
  type SQLChunk,
  StringChunk,
  Subquery,
  Table,
  View,
  ViewBaseConfig,
} from 'drizzle-orm';
import { CasingCache } from 'drizzle-orm/casing';
import { PgDialect, PgSelectQueryBuilderBase } from 'drizzle-orm/pg-core';
import { TrellisError } from '../engine/errors.js';
import { quoteIdent, quoteLiteral } from '../engine/identifiers.js';

/** How drizzle names columns declared without a name (drizzle's own `casing` option). */
export type Casing = 'snake_case' | 'camelCase';

/** A source of the statement, as expressions may refer to it. */
export interface SourceRef {
  /** The name expressions use: the alias, or the table's own name. */
  refName: string;
  /** The schema the table was declared in, undefined for drizzle's default (search_path). */
  schema: string | undefined;
  /** Whether `refName` is an alias: columns of an aliased table render without schema. */
  isAlias: boolean;
}

/**
 * What the rendering of one statement shares with the subqueries inside it: the casing,
 * the targets read (a subquery's included), and whether any part needs the AS form.
 */
export interface RenderScope {
  readonly casing: Casing | undefined;
  readonly reads: string[];
  /** Set when the statement holds a form only the AS form (view SQL) writes. */
  viewSql: boolean;
}

const NESTED = Symbol.for('trellis-pg:nested-select');

/** A SELECT written inside an expression (`subquery()`): rendered in the scope around it. */
export interface NestedSelect {
  readonly [NESTED]: (outer: readonly SourceRef[], scope: RenderScope) => string;
}

/** Marks `render` as the way an object is written inside an expression (as `(SELECT …)`). */
export function nestedSelect<T extends object>(
  value: T,
  render: (outer: readonly SourceRef[], scope: RenderScope) => string,
): T & NestedSelect {
  Object.defineProperty(value, NESTED, { value: render, enumerable: false });
  return value as T & NestedSelect;
}

/** Whether a value is written as a SELECT (`subquery()`, `derived()`). */
export function isNestedSelect(value: unknown): value is NestedSelect {
  return typeof value === 'object' && value !== null && NESTED in value;
}

/** The text of a SELECT written in place (a derived table's FROM item, a subquery). */
export function renderNested(
  value: NestedSelect,
  outer: readonly SourceRef[],
  scope: RenderScope,
): string {
  return value[NESTED](outer, scope);
}

/** Renders expressions of one statement; `sources` are the FROM and JOIN items so far. */
export class ExpressionRenderer {
  private readonly dialect: PgDialect;
  private readonly casing: CasingCache;
  private readonly scope: RenderScope | undefined;

  constructor(
    private readonly sources: readonly SourceRef[],
    casing: Casing | RenderScope | undefined,
  ) {
    this.scope = typeof casing === 'object' ? casing : undefined;
    const name = typeof casing === 'object' ? casing.casing : casing;
    this.dialect = new PgDialect(name === undefined ? {} : { casing: name });
    this.casing = new CasingCache(name);
  }

  /** The text of one expression, for `what` (e.g. `WHERE`, `SELECT item total`). */
  render(expression: SQL | Column, what: string): string {
    const query = this.dialect.sqlToQuery(new SQL(this.inline([expression], what)));
    if (query.params.length > 0) {
      throw new TrellisError('validation', `in ${what}: a value could not be written as a literal`);
    }
    return query.sql;
  }

  /** The name drizzle gives a column in the database (its casing applied). */
  columnName(column: Column): string {
    return this.casing.getColumnCasing(column);
  }

  /** A copy of the chunks with every value written as a literal and every name checked. */
  private inline(chunks: readonly unknown[], what: string): SQLChunk[] {
    return chunks.map((chunk): SQLChunk => {
      if (chunk === undefined || is(chunk, StringChunk) || is(chunk, Name)) return chunk;
      if (Array.isArray(chunk)) return this.inline(chunk, what);
      if (is(chunk, SQL.Aliased)) {
        throw new TrellisError(
          'validation',
          `in ${what}: an aliased expression (.as(…)) has no place here: the select key names the column`,
        );
      }
      if (is(chunk, SQL)) return new SQL(this.inline(chunk.queryChunks, what));
      if (is(chunk, Column)) {
        this.checkColumn(chunk, what);
        return chunk;
      }
      if (is(chunk, Table)) {
        this.checkTable(tableRef(chunk), what);
        return chunk;
      }
      if (is(chunk, View)) {
        this.checkTable(viewRef(chunk), what);
        return chunk;
      }
      if (is(chunk, Placeholder)) {
        throw new TrellisError(
          'validation',
          `in ${what}: sql.placeholder("${chunk.name}") has no value in a statement: write the value itself`,
        );
      }
      if (is(chunk, Param)) {
        if (is(chunk.value, Placeholder)) return this.inline([chunk.value], what);
        const mapped = chunk.value === null ? null : chunk.encoder.mapToDriverValue(chunk.value);
        if (is(mapped, SQL)) return new SQL(this.inline(mapped.queryChunks, what));
        return new StringChunk(literal(mapped, what));
      }
      if (isNestedSelect(chunk)) {
        if (!this.scope) {
          throw new TrellisError('validation', `in ${what}: a subquery has no place here`);
        }
        this.scope.viewSql = true;
        return new StringChunk(`(${chunk[NESTED](this.sources, this.scope)})`);
      }
      if (is(chunk, Subquery) || is(chunk, PgSelectQueryBuilderBase)) {
        // A drizzle select (db.select()…): written by the app's dialect, its tables unchecked.
        throw new TrellisError(
          'validation',
          `in ${what}: a drizzle select (db.select()…) cannot be part of a transform: write the subquery with subquery((t) => t.from(…).select(…)) from trellis-pg/drizzle`,
        );
      }
      if (isSqlWrapper(chunk)) {
        return new SQL([
          new StringChunk('('),
          new SQL(this.inline([chunk.getSQL()], what)),
          new StringChunk(')'),
        ]);
      }
      return new StringChunk(literal(chunk, what));
    });
  }

  private checkColumn(column: Column, what: string): void {
    const table = column.table as unknown as Table;
    const ref = is(table, View) ? viewRef(table as unknown as View) : tableRef(table);
    this.checkTable(ref, what, ` (column ${this.columnName(column)})`);
  }

  private checkTable(ref: SourceRef, what: string, detail = ''): void {
    const found = this.sources.some(
      (s) =>
        s.refName === ref.refName &&
        (s.isAlias || ref.isAlias || s.schema === undefined || s.schema === ref.schema),
    );
    if (!found) {
      const known = this.sources.map((s) => s.refName).join(', ');
      throw new TrellisError(
        'validation',
        `in ${what}: ${ref.refName}${detail} is not a table of this statement (its tables: ${known})`,
      );
    }
  }
}

function isSqlWrapper(value: unknown): value is { getSQL(): SQL } {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { getSQL?: unknown }).getSQL === 'function'
  );
}

/**
 * drizzle's table symbols (registered with Symbol.for; its `Table.Symbol` is internal to
 * its types). An aliased table answers `name` with the alias, `originalName` with its own.
 */
const TABLE = {
  name: Symbol.for('drizzle:Name'),
  schema: Symbol.for('drizzle:Schema'),
  originalName: Symbol.for('drizzle:OriginalName'),
  isAlias: Symbol.for('drizzle:IsAlias'),
} as const;

/** How a table (or an aliased table) is referred to in the statement. */
export function tableRef(table: Table): SourceRef {
  const t = table as unknown as Record<symbol, unknown>;
  const isAlias = t[TABLE.isAlias] === true;
  return {
    refName: t[TABLE.name] as string,
    schema: t[TABLE.schema] as string | undefined,
    isAlias,
  };
}

/** How a view (a Trellis target read as a source) is referred to in the statement. */
export function viewRef(view: View): SourceRef {
  const config = (view as unknown as Record<symbol, { name: string; schema?: string }>)[
    ViewBaseConfig
  ];
  if (!config) throw new TrellisError('validation', 'not a drizzle view');
  return { refName: config.name, schema: config.schema, isAlias: false };
}

/** The FROM / JOIN item for a table: `"schema"."table" AS "alias"`, as drizzle names it. */
export function tableItem(table: Table): string {
  const t = table as unknown as Record<symbol, unknown>;
  const schema = t[TABLE.schema] as string | undefined;
  const original = t[TABLE.originalName] as string;
  const name =
    schema === undefined ? quoteIdent(original) : `${quoteIdent(schema)}.${quoteIdent(original)}`;
  return t[TABLE.isAlias] === true ? `${name} AS ${quoteIdent(t[TABLE.name] as string)}` : name;
}

/** The FROM / JOIN item for a view. */
export function viewItem(view: View): string {
  const ref = viewRef(view);
  return ref.schema === undefined
    ? quoteIdent(ref.refName)
    : `${quoteIdent(ref.schema)}.${quoteIdent(ref.refName)}`;
}

/**
 * A value as a SQL literal. Strings are quoted (standard_conforming_strings, on in every
 * supported Postgres); numbers, bigints and booleans are written as they are; a Date as its
 * ISO text (the column's type reads it); bytes as bytea hex; a plain object as JSON text.
 */
export function literal(value: unknown, what: string): string {
  if (value === null || value === undefined) return 'NULL';
  switch (typeof value) {
    case 'string':
      return quoteLiteral(value);
    case 'boolean':
      return value ? 'TRUE' : 'FALSE';
    case 'bigint':
      return value.toString();
    case 'number':
      // NaN and the infinities have no numeric literal; Postgres reads them as text.
      return Number.isFinite(value) ? String(value) : quoteLiteral(String(value));
    case 'object':
      if (value instanceof Date) {
        if (Number.isNaN(value.getTime())) {
          throw new TrellisError('validation', `in ${what}: an invalid Date has no literal`);
        }
        return quoteLiteral(value.toISOString());
      }
      if (value instanceof Uint8Array) {
        return quoteLiteral(`\\x${Buffer.from(value).toString('hex')}`);
      }
      if (Object.getPrototypeOf(value) === Object.prototype) {
        return quoteLiteral(JSON.stringify(value));
      }
      break;
  }
  throw new TrellisError(
    'validation',
    `in ${what}: a value of type ${typeof value === 'object' ? (value.constructor?.name ?? 'object') : typeof value} cannot be written as a literal: use sql\`…\` to write it`,
  );
}
