/**
 * One SELECT of a drizzle-built statement (the statement itself, a branch of a set
 * operation, a subquery): its parts as the builder collects them, and their text in the
 * FROM-first form and in the AS form (view SQL, for DISTINCT ON, top-N and subqueries).
 */
import { type AnyColumn, is, type SQL, Table, View } from 'drizzle-orm';
import { toCamelCase, toSnakeCase } from 'drizzle-orm/casing';
import type { PgTable } from 'drizzle-orm/pg-core';
import { TrellisError } from '../engine/errors.js';
import { assertIdentifier, quoteIdent } from '../engine/identifiers.js';
import {
  ExpressionRenderer,
  isNestedSelect,
  type RenderScope,
  renderNested,
  type SourceRef,
  tableItem,
  tableRef,
  viewItem,
  viewRef,
} from './render.js';
import { definitionOn } from './target-key.js';
import { type AnyTrellisTarget, type TargetColumnSpec, targetColumn } from './target-view.js';

/** A source a statement can read: a drizzle table (aliases included) or another target. */
export type TransformSource = PgTable | AnyTrellisTarget;

export interface Join {
  kind: 'INNER' | 'LEFT';
  source: TransformSource;
  on: SQL | undefined;
}

/** Top-N per partition: the rows ranked up to `limit` by `rank` over each partition. */
export interface TopN {
  partitionBy: Array<AnyColumn | SQL>;
  orderBy: Array<AnyColumn | SQL>;
  limit: number;
  rank: 'row_number' | 'rank' | 'dense_rank';
}

export interface Parts {
  from?: TransformSource;
  joins: Join[];
  selection?: Record<string, AnyColumn | SQL>;
  where?: SQL | undefined;
  groupBy?: Array<AnyColumn | SQL>;
  having?: SQL | undefined;
  distinctOn?: { on: Array<AnyColumn | SQL>; orderBy: Array<AnyColumn | SQL> };
  topN?: TopN;
  withoutSourceIndex: boolean;
  withoutRowSecurity: boolean;
}

export function emptyParts(): Parts {
  return { joins: [], withoutSourceIndex: false, withoutRowSecurity: false };
}

/** A SELECT's text, both ways, and the columns it makes. */
export interface RenderedSelect {
  /** `FROM …`, `JOIN …`, `SELECT …`, `WHERE …`, …: the FROM-first form's lines. */
  fromFirst: string[];
  /** `SELECT …`, `FROM …`, …: the AS form's lines (a top-N wrapped in a derived table). */
  viewSql: string[];
  /** Whether only the AS form writes it (DISTINCT ON, top-N). */
  needsViewSql: boolean;
  columns: TargetColumnSpec[];
}

/** The derived table a top-N is written in, and its rank column. */
const RANKED = 'ranked';
const RANK = 'trellis_rank';

/**
 * Renders one SELECT. `outer`: the sources of the statement around a subquery (which
 * its conditions may name); `keys`: the select keys in the order to write them (a set
 * operation's branches follow the first branch's order: SQL matches columns by place).
 */
export function renderSelect(
  parts: Parts,
  what: string,
  scope: RenderScope,
  outer: readonly SourceRef[] = [],
  keys?: readonly string[],
): RenderedSelect {
  if (!parts.from || !parts.selection) {
    throw new TrellisError('validation', `${what}: a statement needs FROM and SELECT`);
  }
  const refs: SourceRef[] = [];
  const nullable = new Set<string>();
  const item = (source: TransformSource, role: string): string => {
    const ref = sourceRef(source, `${what}: ${role}`);
    if (refs.some((r) => r.refName === ref.refName)) {
      throw new TrellisError(
        'validation',
        `${what}: ${ref.refName} is named twice: alias one of them (alias(table, 'name') from drizzle-orm/pg-core)`,
      );
    }
    refs.push(ref);
    if (is(source, View)) {
      const target = definitionOn(source)?.target as string;
      if (!scope.reads.includes(target)) scope.reads.push(target);
      return viewItem(source as unknown as View);
    }
    if (isNestedSelect(source)) return renderNested(source, outer, scope);
    return tableItem(source as Table);
  };
  const from = [`FROM ${item(parts.from, 'FROM')}`];
  for (const join of parts.joins) {
    const joined = item(join.source, `${join.kind} JOIN`);
    const ref = refs[refs.length - 1] as SourceRef;
    if (join.kind === 'LEFT') nullable.add(ref.refName);
    if (join.on === undefined) {
      throw new TrellisError('validation', `${what}: JOIN ${ref.refName} needs an ON condition`);
    }
    const on = new ExpressionRenderer([...outer, ...refs], scope).render(
      join.on,
      `JOIN ${ref.refName} ON`,
    );
    from.push(`${join.kind} JOIN ${joined} ON ${on}`);
  }
  const renderer = new ExpressionRenderer([...outer, ...refs], scope);
  const columns: TargetColumnSpec[] = [];
  const items: string[] = [];
  const selection = parts.selection;
  const order = keys ?? Object.keys(selection);
  if (keys && !sameKeys(keys, Object.keys(selection))) {
    throw new TrellisError(
      'validation',
      `${what}: the branch selects ${Object.keys(selection).join(', ')}, the first branch ${keys.join(', ')}: select the same keys`,
    );
  }
  for (const key of order) {
    const value = selection[key] as AnyColumn | SQL;
    const columnName = targetColumnName(key, scope.casing);
    assertIdentifier(`${what}: column name`, columnName);
    if (columns.some((c) => c.name === columnName)) {
      throw new TrellisError('validation', `${what}: two select items name column ${columnName}`);
    }
    items.push(`${renderer.render(value, `SELECT item ${key}`)} AS ${quoteIdent(columnName)}`);
    columns.push(targetColumn(key, columnName, value, nullable));
  }
  if (items.length === 0) throw new TrellisError('validation', `${what}: SELECT lists no column`);
  const list = (exprs: Array<AnyColumn | SQL>, clause: string) =>
    exprs.map((e, i) => renderer.render(e, `${clause} item ${i + 1}`)).join(', ');
  const rest: string[] = [];
  if (parts.where !== undefined) rest.push(`WHERE ${renderer.render(parts.where, 'WHERE')}`);
  if (parts.groupBy !== undefined && parts.groupBy.length > 0) {
    rest.push(`GROUP BY ${list(parts.groupBy, 'GROUP BY')}`);
  }
  if (parts.having !== undefined) rest.push(`HAVING ${renderer.render(parts.having, 'HAVING')}`);
  const fromFirst = [...from, `SELECT ${items.join(', ')}`, ...rest];
  let viewSql = [`SELECT ${items.join(', ')}`, ...from, ...rest];
  const { distinctOn, topN } = parts;
  if (distinctOn && topN) {
    throw new TrellisError('validation', `${what}: DISTINCT ON and a top-N in one SELECT`);
  }
  if (distinctOn) {
    if (distinctOn.on.length === 0) {
      throw new TrellisError('validation', `${what}: DISTINCT ON needs an expression`);
    }
    const on = list(distinctOn.on, 'DISTINCT ON');
    const then = distinctOn.orderBy.length ? `, ${list(distinctOn.orderBy, 'ORDER BY')}` : '';
    viewSql = [`SELECT DISTINCT ON (${on}) ${items.join(', ')}`, ...from, ...rest];
    viewSql.push(`ORDER BY ${on}${then}`);
  }
  if (topN) {
    if (!Number.isSafeInteger(topN.limit) || topN.limit < 1) {
      throw new TrellisError('validation', `${what}: a top-N's limit is a whole number from 1`);
    }
    if (topN.partitionBy.length === 0 || topN.orderBy.length === 0) {
      throw new TrellisError('validation', `${what}: a top-N needs partitionBy and orderBy`);
    }
    if (columns.some((c) => c.name === RANK)) {
      throw new TrellisError('validation', `${what}: ${RANK} is the top-N's own column`);
    }
    const window = `PARTITION BY ${list(topN.partitionBy, 'PARTITION BY')} ORDER BY ${list(topN.orderBy, 'ORDER BY')}`;
    const ranked = [
      `SELECT ${items.join(', ')}, ${topN.rank}() OVER (${window}) AS ${quoteIdent(RANK)}`,
      ...from,
      ...rest,
    ];
    const outerItems = columns.map((c) => `${quoteIdent(RANKED)}.${quoteIdent(c.name)}`);
    viewSql = [
      `SELECT ${outerItems.map((c, i) => `${c} AS ${quoteIdent(columns[i]?.name as string)}`).join(', ')}`,
      `FROM (${ranked.join(' ')}) AS ${quoteIdent(RANKED)}`,
      `WHERE ${quoteIdent(RANKED)}.${quoteIdent(RANK)} <= ${topN.limit}`,
    ];
  }
  const derived = [parts.from, ...parts.joins.map((j) => j.source)].some(isNestedSelect);
  return { fromFirst, viewSql, needsViewSql: !!(distinctOn || topN || derived), columns };
}

function sameKeys(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((k) => b.includes(k));
}

function sourceRef(source: TransformSource, what: string): SourceRef {
  if (is(source, Table)) return tableRef(source as Table);
  if (is(source, View) && definitionOn(source) !== undefined) {
    return viewRef(source as unknown as View);
  }
  throw new TrellisError(
    'validation',
    `${what}: a source is a drizzle table or another transform's target (views are not sources)`,
  );
}

/** A select key as a column name: drizzle's casing applied, as to a column declared unnamed. */
export function targetColumnName(key: string, casing: RenderScope['casing']): string {
  if (casing === 'snake_case') return toSnakeCase(key);
  if (casing === 'camelCase') return toCamelCase(key);
  return key;
}
