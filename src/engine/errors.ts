/**
 * Every failure a Trellis call reports is a `TrellisError` with a stable `code` from this
 * closed union. Callers branch on `code`, never on `message` (which may change wording).
 */
export const TRELLIS_ERROR_CODES = [
  /** A statement does not follow the grammar; `position` says where. */
  'parse',
  /** A statement parses but names, types or shape are refused; the message names the part. */
  'validation',
  /** The transform, address or job named does not exist. */
  'not_found',
  /** The request clashes with the current state (a name taken, a state that forbids it). */
  'conflict',
  /** The call did not settle in time (or no pooled connection was free in time). */
  'timeout',
  /** The handle was shut down before or while the call ran. */
  'shutdown',
  /** Postgres could not be reached or refused the session; the message says what to fix. */
  'connection',
  /**
   * The URL leads to a connection pooler in transaction (or statement) pooling mode, which
   * hands the server session to other clients between transactions: connect directly, or
   * through session pooling (README, "Connection poolers").
   */
  'transaction_pooling',
  /**
   * The server session is read-only (`default_transaction_read_only` is on for the database
   * or role, or the server is a standby): the engine cannot write its catalog or targets
   * there. Its workers retry on fresh sessions and recover once the server takes writes
   * (README, "Read-only sessions").
   */
  'read_only',
  /** Trellis's catalog schema is not installed yet: run `migrate()` first. */
  'not_migrated',
  /** The catalog schema holds a breaking migration newer than this version of trellis-pg. */
  'incompatible_schema',
  /**
   * The call met concurrent work (a deadlock or serialization failure with the app's
   * writers or the engine's workers) on every attempt it made; nothing was changed, and
   * the same call can be made again.
   */
  'transient',
  /** Postgres reported an error the engine did not expect; `cause` keeps it. */
  'database',
  /** Anything else; `cause` keeps the original error. */
  'unknown',
] as const;

export type TrellisErrorCode = (typeof TRELLIS_ERROR_CODES)[number];

export interface TrellisErrorOptions {
  cause?: unknown;
  /** For `parse` errors: the 1-based character offset in the statement. */
  position?: number;
  /** The Postgres SQLSTATE, when the error came from Postgres. */
  sqlstate?: string;
}

export class TrellisError extends Error {
  override readonly name = 'TrellisError';
  readonly code: TrellisErrorCode;
  readonly position: number | undefined;
  readonly sqlstate: string | undefined;

  constructor(code: TrellisErrorCode, message: string, options: TrellisErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.position = options.position;
    this.sqlstate = options.sqlstate;
  }
}

export function isTrellisError(error: unknown): error is TrellisError {
  return error instanceof TrellisError;
}
