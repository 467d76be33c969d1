/**
 * The SQL line that applies a statement from a migration: `SELECT "trellis".apply('…');`.
 */
import { TrellisError } from '../engine/errors.js';
import { assertIdentifier, quoteIdent, quoteLiteral } from '../engine/identifiers.js';
import { DEFAULTS } from '../engine/options.js';
import { definitionOn } from './target-key.js';

export interface ApplyStatementSqlOptions {
  /**
   * The catalog schema of the Trellis instance.
   * @defaultValue `'trellis'`
   */
  schema?: string;
}

/**
 * The SQL that applies one Trellis statement (or the statement of a target `transform()`
 * returned) from a migration, e.g.
 * `SELECT "trellis".apply('TRANSFORM widget_prices FROM widgets SELECT price AS price');`.
 * The statement is quoted as a literal and the schema as an identifier, so neither can
 * inject SQL.
 *
 * `<schema>.apply(statement text) RETURNS jsonb` is part of Trellis's schema (install it
 * first, in the same or an earlier migration): it runs in the migration's transaction, so
 * the transform commits or rolls back with the DDL around it. A refused statement fails
 * the migration with SQLSTATE `TRP01` (parse) or `TRV01` (validation).
 */
export function applyStatementSql(
  statement: string | object,
  options: ApplyStatementSqlOptions = {},
): string {
  const schema = options.schema ?? DEFAULTS.schema;
  assertIdentifier('schema', schema);
  const text = typeof statement === 'string' ? statement : definitionOn(statement)?.statement;
  if (text === undefined) {
    throw new TrellisError('validation', 'applyStatementSql takes a statement or a Trellis target');
  }
  return `SELECT ${quoteIdent(schema)}.apply(${quoteLiteral(text)});`;
}
