import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { TransformHistory } from './status-types.js';

interface HistoryJson {
  target: string;
  samples: Array<{
    at: string;
    lagSeconds: number | string;
    lagSegments: number | string;
    keysPerSecond: number | string | null;
    backfillDone: number | string | null;
  }>;
}

const maybeNumber = (v: number | string | null): number | null => (v === null ? null : Number(v));

/**
 * The last hour of every transform, as `<schema>.history()` returns it (migration 0034):
 * the samples the staging worker takes every 10 s, oldest first, ordered by target.
 */
export async function readHistory(session: Session, schema: string): Promise<TransformHistory[]> {
  const rows = await session.query<{ history: HistoryJson }>(
    `SELECT h AS history FROM ${quoteIdent(schema)}.history() h`,
  );
  return rows.map(({ history }) => ({
    target: history.target,
    samples: history.samples.map((s) => ({
      at: new Date(s.at),
      lagSeconds: Number(s.lagSeconds),
      lagSegments: Number(s.lagSegments),
      keysPerSecond: maybeNumber(s.keysPerSecond),
      backfillDone: maybeNumber(s.backfillDone),
    })),
  }));
}
