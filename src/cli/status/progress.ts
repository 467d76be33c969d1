import type { Status } from '../../engine/catalog/status-types.js';

/** A backfill's progress as every status view shows it. */
export interface Progress {
  done: number;
  /** Keys in all (an estimate), null while unknown. */
  total: number | null;
  /** done / total, null while unknown. */
  fraction: number | null;
  /** Keys built a second lately (status().backfill.rate), null while unknown. */
  rate: number | null;
  /** Seconds left at that rate, null while unknown. */
  etaSeconds: number | null;
}

/**
 * How far a backfill is, as every status view shows it (the CLI's table and lines, the
 * operations page): keys done and in all (an estimate), the fraction (null: unknown), and
 * its pace and the time it has left.
 */
export function progressOf(status: Status): Progress | null {
  if (status.status !== 'backfilling' || !status.backfill) return null;
  const { keysDone: done, keysTotal: total } = status.backfill;
  const fraction = total && total > 0 ? Math.min(1, done / total) : null;
  return {
    done,
    total,
    fraction,
    rate: status.backfill.rate ?? null,
    etaSeconds: status.backfill.etaSeconds ?? null,
  };
}

/** A duration as a person reads it: `45 s`, `3 min`, `1 h 20 min`. */
export function durationText(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const minutes = Math.round(s / 60);
  if (minutes < 60) return `${minutes} min`;
  const h = Math.floor(minutes / 60);
  const m = minutes % 60;
  return m === 0 ? `${h} h` : `${h} h ${m} min`;
}

/** A backfill's pace, `1,234 keys/s, about 3 min left`; empty while unknown. */
export function paceText(p: Progress): string {
  if (p.rate === null) return '';
  const rate = `${Math.round(p.rate).toLocaleString('en-US')} keys/s`;
  return p.etaSeconds === null ? rate : `${rate}, about ${durationText(p.etaSeconds)} left`;
}
