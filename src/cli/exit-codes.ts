import type { TrellisErrorCode } from '../engine/errors.js';

/**
 * The exit status for each error code, so scripts can branch without reading stderr
 * (README, "CLI reference"; ADR 0021). 1 is every failure not listed.
 */
export const EXIT_CODES = {
  ok: 0,
  failed: 1,
  /** Bad arguments, or a statement refused (parse, validation). */
  usage: 2,
  notFound: 3,
  connection: 4,
  /** Trellis's schema is not installed, or is newer than this trellis-pg. */
  schema: 5,
  conflict: 6,
  timeout: 7,
  /** `trellis release`: the key was retried and failed again (it is held again). */
  heldAgain: 8,
  /** `trellis check`: the target differs from its definition. */
  diverged: 9,
} as const;

export function exitCodeFor(code: TrellisErrorCode | 'unknown'): number {
  switch (code) {
    case 'parse':
    case 'validation':
      return EXIT_CODES.usage;
    case 'not_found':
      return EXIT_CODES.notFound;
    case 'connection':
    case 'transaction_pooling':
    case 'read_only':
      return EXIT_CODES.connection;
    case 'not_migrated':
    case 'incompatible_schema':
      return EXIT_CODES.schema;
    case 'conflict':
      return EXIT_CODES.conflict;
    case 'timeout':
      return EXIT_CODES.timeout;
    default:
      return EXIT_CODES.failed;
  }
}

/** The table of exit statuses, for `trellis --help`. */
export const EXIT_CODES_HELP = `Exit status:
  0  done
  1  failed (database, transient, shutdown, unknown)
  2  bad arguments, or a statement refused (parse, validation)
  3  not found (a transform, address or key)
  4  cannot connect (connection, transaction_pooling, read_only)
  5  Trellis's schema not installed, or newer than this trellis-pg
  6  conflict with the current state
  7  timeout
  8  trellis release: the key failed again and is held again
  9  trellis check: the target diverged from its definition`;
