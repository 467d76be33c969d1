import { sqlstateOf } from '../sqlstate.js';

/**
 * SQLSTATE classes a single row can cause while being re-derived: bad data (a cast, a
 * division by zero), a constraint on the target, an exception raised by a user function.
 * Anything else (deadlock, lock timeout, lost connection, a missing table) is the page's
 * or the system's, and is retried rather than blamed on a row.
 */
const ROW_CLASSES = new Set(['22', '23', 'P0', '2F', '39', '44', '54']);

export function isRowError(error: unknown): boolean {
  const state = sqlstateOf(error);
  return state !== undefined && ROW_CLASSES.has(state.slice(0, 2));
}

/** Retry delay after the `attempts`-th failure: 0.5 s doubling, at most 30 s. */
export function backoffMs(attempts: number): number {
  return Math.min(30_000, 500 * 2 ** Math.max(0, attempts - 1));
}
