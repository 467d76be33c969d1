import { TrellisError } from './errors.js';

/** Quotes an identifier for SQL the way Postgres's quote_ident does, always. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** Quotes a schema-qualified name. */
export function quoteQualified(schema: string, name: string): string {
  return `${quoteIdent(schema)}.${quoteIdent(name)}`;
}

/** Quotes a string literal (standard_conforming_strings is on in every supported version). */
export function quoteLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}

/**
 * Names given in options (schemas) are validated once, at the boundary: non-empty, at most
 * 63 bytes (Postgres truncates longer names silently), no NUL. Anything else is allowed,
 * because every name is quoted wherever the engine writes it.
 */
export function assertIdentifier(what: string, name: string): void {
  if (typeof name !== 'string' || name.length === 0) {
    throw new TrellisError('validation', `${what} must be a non-empty name`);
  }
  if (Buffer.byteLength(name, 'utf8') > 63) {
    throw new TrellisError('validation', `${what} "${name}" is longer than 63 bytes`);
  }
  if (name.includes('\0')) {
    throw new TrellisError('validation', `${what} must not contain a NUL character`);
  }
}
