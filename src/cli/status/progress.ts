import type { Status } from '../../engine/catalog/status-types.js';

/**
 * How far a backfill is, as every status view shows it (the CLI's table and lines, the
 * operations page): keys done and in all (an estimate), and the fraction (null: unknown).
 */
export function progressOf(
  status: Status,
): { done: number; total: number | null; fraction: number | null } | null {
  if (status.status !== 'backfilling' || !status.backfill) return null;
  const { keysDone: done, keysTotal: total } = status.backfill;
  const fraction = total && total > 0 ? Math.min(1, done / total) : null;
  return { done, total, fraction };
}
