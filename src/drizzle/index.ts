/**
 * Helpers for apps that manage their schema with drizzle-kit. drizzle-orm is not imported
 * here: what this module returns is SQL text for a custom migration
 * (`drizzle-kit generate --custom`), which drizzle-kit runs in its migration transaction.
 *
 * Typed statement builders over drizzle table objects, and typed reads of targets, arrive
 * with the statements issue.
 * @packageDocumentation
 */
import { assertIdentifier, quoteIdent, quoteLiteral } from '../engine/identifiers.js';
import { DEFAULTS } from '../engine/options.js';

export interface ApplyStatementSqlOptions {
  /**
   * The catalog schema of the Trellis instance.
   * @defaultValue `'trellis'`
   */
  schema?: string;
}

/**
 * The SQL that applies one Trellis statement from a migration, e.g.
 * `SELECT "trellis".apply('TRANSFORM widget_prices FROM widgets SELECT price AS price');`.
 * The statement is quoted as a literal and the schema as an identifier, so neither can
 * inject SQL.
 *
 * `<schema>.apply(statement text)` is created by Trellis's schema when the statements
 * issue lands; until then the SQL this returns fails with "function does not exist".
 */
export function applyStatementSql(
  statement: string,
  options: ApplyStatementSqlOptions = {},
): string {
  const schema = options.schema ?? DEFAULTS.schema;
  assertIdentifier('schema', schema);
  return `SELECT ${quoteIdent(schema)}.apply(${quoteLiteral(statement)});`;
}
