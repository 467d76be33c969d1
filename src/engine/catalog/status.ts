import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import type { Status } from './status-types.js';

interface StatusRow {
  target_name: string;
  paused_at: Date | null;
  pause_reason: string | null;
  paused_columns: string[];
  paused_upstream_columns: string[];
}

/** A transform's status, or `not_found`. */
export async function readStatus(
  session: Session,
  schema: string,
  target: string,
): Promise<Status> {
  const s = quoteIdent(schema);
  const [row] = await session.query<StatusRow>(
    `SELECT t.target_name, t.paused_at, t.pause_reason,
            ARRAY(SELECT t.target_name || '.' || c.name FROM ${s}.transform_columns c
                   WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name) AS paused_columns,
            -- Columns this transform reads of an upstream transform's target that are paused
            -- there (every column it reads, when the upstream transform is paused as a whole).
            ARRAY(SELECT DISTINCT u.target_name || '.' || uc.name
                    FROM ${s}.transform_sources src
                    JOIN ${s}.transforms u ON u.target_oid = src.source_oid
                    JOIN ${s}.transform_columns uc ON uc.transform_id = u.id
                   WHERE src.transform_id = t.id
                     AND uc.name = ANY (src.read_columns)
                     AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
                   ORDER BY 1) AS paused_upstream_columns
       FROM ${s}.transforms t
      WHERE t.target_name = $1`,
    [target],
  );
  if (!row) throw new TrellisError('not_found', `there is no transform named ${target}`);
  return {
    target: row.target_name,
    status: row.paused_at ? 'paused' : 'waiting_to_backfill',
    pauseReason: row.pause_reason,
    heldKeys: 0,
    pausedColumns: row.paused_columns,
    pausedUpstreamColumns: row.paused_upstream_columns,
    sourceIndexGaps: [],
    correcting: [],
    captureFailure: null,
    captureWait: null,
    buildFailure: null,
    drainFailure: null,
    backfill: null,
    lag: { segments: 0, seconds: 0 },
  };
}
