import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';

/** What `apply()` did, one shape per statement form. */
export type ApplyResult =
  | { kind: 'transform_defined'; target: string }
  | { kind: 'paused'; address: string }
  | { kind: 'resumed'; addresses: string[] }
  | { kind: 'dropped'; target: string }
  | { kind: 'altered'; target: string }
  /**
   * `ALTER TRANSFORM t AS …` (ADR 0055): the new definition is being built beside the old
   * one, which keeps serving reads; `changes` says what the switch will do to the target.
   */
  | { kind: 'redefining'; target: string; changes: string[] };

const KINDS = new Set<ApplyResult['kind']>([
  'transform_defined',
  'paused',
  'resumed',
  'dropped',
  'altered',
  'redefining',
]);

function toApplyResult(value: unknown): ApplyResult {
  const kind = (value as { kind?: unknown } | null)?.kind;
  if (typeof kind !== 'string' || !KINDS.has(kind as ApplyResult['kind'])) {
    throw new TrellisError(
      'unknown',
      `apply() returned an unexpected result: ${JSON.stringify(value)}`,
    );
  }
  return value as ApplyResult;
}

/**
 * Runs a statement through `<schema>.apply()` (or `<schema>.define()`, which refuses all
 * but TRANSFORM): the one implementation of the grammar, in SQL, shared with migrations.
 */
export async function applyStatement(
  session: Session,
  schema: string,
  statement: string,
  transformOnly: boolean,
): Promise<ApplyResult> {
  if (typeof statement !== 'string') {
    throw new TrellisError('validation', 'a statement must be a string');
  }
  // Postgres text cannot hold NUL: the server would refuse the parameter itself, with an
  // internal error rather than a statement one. Refused here the way the grammar refuses
  // any other character it cannot read, at its (1-based, code point) position.
  const nul = statement.indexOf('\0');
  if (nul >= 0) {
    const position = [...statement.slice(0, nul)].length + 1;
    throw new TrellisError(
      'parse',
      `unexpected character: expected a token, found "\\u0000" at character ${position}`,
      { position },
    );
  }
  const fn = transformOnly ? 'define' : 'apply';
  try {
    const [row] = await session.query<{ result: unknown }>(
      `SELECT ${quoteIdent(schema)}.${fn}($1) AS result`,
      [statement],
    );
    return toApplyResult(row?.result);
  } catch (error) {
    // <schema>.apply() retries a deadlock itself (migration 0027) and says TRT01 when it gives up; a
    // deadlock or serialization failure that still reaches here (outside its retries) is
    // the same condition, and nothing was changed.
    const state = sqlstateOf(error);
    if (state === SQLSTATE.deadlockDetected || state === SQLSTATE.serializationFailure) {
      throw new TrellisError(
        'transient',
        `the statement met concurrent work (${(error as Error).message}): try it again`,
        { cause: error, sqlstate: state },
      );
    }
    throw error;
  }
}
