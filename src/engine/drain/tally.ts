/**
 * What the drain did, counted for its metrics: the re-derivation statement (rederiveSql)
 * reports how many keys it re-derived and how many target rows it upserted and deleted.
 */
import type { Session } from '../db/session.js';
import type { AppliedPage } from '../metrics/handle-metrics.js';

/** Keys re-derived, target rows upserted and deleted. */
export interface Tally {
  keys: number;
  upserted: number;
  deleted: number;
}

export function emptyTally(): Tally {
  return { keys: 0, upserted: 0, deleted: 0 };
}

/** What applying a page (or a small range) did: what the drain's metrics count. */
export type AppliedWork = AppliedPage;

export function appliedWork(
  target: string,
  tally: Tally,
  started: number,
  failed: boolean,
): AppliedWork {
  return { target, ...tally, seconds: (performance.now() - started) / 1000, failed };
}

/** Runs a re-derivation statement (rederiveSql) and adds what it reports to `tally`. */
export async function rederiveCounted(
  session: Session,
  sql: string,
  params: unknown[],
  tally: Tally,
): Promise<void> {
  const [row] = await session.query<{ keys: number; upserted: number; removed: number }>(
    sql,
    params,
  );
  tally.keys += Number(row?.keys ?? 0);
  tally.upserted += Number(row?.upserted ?? 0);
  tally.deleted += Number(row?.removed ?? 0);
}
