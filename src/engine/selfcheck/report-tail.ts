import type { DrainFailure } from '../catalog/status-types.js';
import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { SelfCheckReport } from './types.js';

/** The transform's held keys and open drain failures, as the check ends. */
export async function readTail(
  session: Session,
  schema: string,
  transformId: number,
): Promise<{ heldKeys: SelfCheckReport['heldKeys']; drainFailures: DrainFailure[] }> {
  const s = quoteIdent(schema);
  const [row] = await session.query<{
    held: number;
    oldest: Date | null;
    failures: Array<{
      seg: string;
      tables: string[];
      error: string;
      sqlstate: string | null;
      since: string;
      last_seen: string;
      attempts: number;
    }>;
  }>(
    `SELECT (SELECT count(*) FROM ${s}.held_keys h WHERE h.transform_id = $1)::int AS held,
            (SELECT min(held_at) FROM ${s}.held_keys h WHERE h.transform_id = $1) AS oldest,
            coalesce((
              SELECT json_agg(json_build_object(
                       'seg', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
                       'sqlstate', pg.sqlstate, 'since', pg.first_failed_at,
                       'last_seen', pg.last_failed_at,
                       'tables', ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                         FROM ${s}.transform_sources ts
                                        WHERE ts.transform_id = $1 ORDER BY ts.ordinal))
                     ORDER BY pg.page)
                FROM ${s}.pages pg JOIN ${s}.pipeline p ON p.transform_id = pg.transform_id
               WHERE pg.transform_id = $1 AND pg.attempts > 0), '[]') AS failures`,
    [transformId],
  );
  return {
    heldKeys: { count: row?.held ?? 0, oldestPoisonedAt: row?.oldest ?? null },
    drainFailures: (row?.failures ?? []).map((f) => ({
      segSeq: Number(f.seg),
      tables: f.tables,
      error: f.error,
      sqlstate: f.sqlstate,
      since: new Date(f.since),
      lastSeen: new Date(f.last_seen),
      attempts: f.attempts,
    })),
  };
}
