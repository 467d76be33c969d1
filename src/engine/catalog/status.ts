import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import type {
  BackfillProgress,
  BuildFailure,
  CaptureFailure,
  CaptureWait,
  CorrectingNode,
  DrainFailure,
  LastApply,
  Lifecycle,
  LockBlocker,
  PreparedBlocker,
  Redefinition,
  Status,
} from './status-types.js';
import {
  type WorkerFailureJson,
  type WorkerHealthJson,
  workerFailureOf,
  workerHealthOf,
} from './worker-health.js';

/** The JSON `<schema>.status(target)` returns: the Status, with times as ISO text. */
type StatusJson = Omit<
  Status,
  | 'correcting'
  | 'captureFailure'
  | 'captureWait'
  | 'buildFailure'
  | 'drainFailure'
  | 'backfill'
  | 'lastApply'
  | 'restored'
  | 'redefinition'
  | 'workers'
  | 'workerFailure'
> & {
  workers: WorkerHealthJson;
  workerFailure: WorkerFailureJson | null;
  correcting: Array<Omit<CorrectingNode, 'since'> & { since: string }>;
  captureFailure: (Omit<CaptureFailure, 'detectedAt'> & { detectedAt: string }) | null;
  captureWait:
    | (Omit<CaptureWait, 'since' | 'blockers' | 'prepared'> & {
        since: string;
        blockers: Array<
          Omit<LockBlocker, 'xactStart' | 'queryStart'> & {
            xactStart: string | null;
            queryStart: string | null;
          }
        >;
        prepared: Array<Omit<PreparedBlocker, 'prepared'> & { prepared: string }>;
      })
    | null;
  buildFailure: (Omit<BuildFailure, 'nextAttemptAt'> & { nextAttemptAt: string }) | null;
  drainFailure:
    | (Omit<DrainFailure, 'since' | 'lastSeen'> & { since: string; lastSeen: string })
    | null;
  backfill:
    | (Omit<BackfillProgress, 'startedAt' | 'rate' | 'etaSeconds'> & {
        startedAt: string;
        rate?: number | null;
        etaSeconds?: number | null;
      })
    | null;
  lastApply: (Omit<LastApply, 'at' | 'keys'> & { at: string; keys: number | string }) | null;
  restored: { reason: string; detectedAt: string | null } | null;
  redefinition?:
    | (Omit<Redefinition, 'since' | 'at' | 'error' | 'lockMs' | 'readersBlockedMs' | 'staged'> & {
        error?: string | null;
        lockMs?: number | null;
        readersBlockedMs?: number | null;
        staged?: boolean | null;
        since?: string | null;
        at?: string | null;
      })
    | null;
};

const date = (text: string): Date => new Date(text);
const maybeDate = (text: string | null): Date | null => (text === null ? null : new Date(text));

/**
 * A transform's status, or `not_found`: what `<schema>.status(target)` returns (migration
 * 0023, the one implementation, callable from psql), with its times as Dates.
 */
export async function readStatus(
  session: Session,
  schema: string,
  target: string,
): Promise<Status> {
  const [row] = await session.query<{ status: StatusJson }>(
    `SELECT ${quoteIdent(schema)}.status($1) AS status`,
    [target],
  );
  if (!row) throw new TrellisError('not_found', `there is no transform named ${target}`);
  const s = row.status;
  return {
    ...s,
    correcting: s.correcting.map((c) => ({ ...c, since: date(c.since) })),
    captureFailure: s.captureFailure
      ? { ...s.captureFailure, detectedAt: date(s.captureFailure.detectedAt) }
      : null,
    captureWait: s.captureWait
      ? {
          ...s.captureWait,
          since: date(s.captureWait.since),
          blockers: s.captureWait.blockers.map((b) => ({
            ...b,
            xactStart: maybeDate(b.xactStart),
            queryStart: maybeDate(b.queryStart),
          })),
          prepared: s.captureWait.prepared.map((p) => ({ ...p, prepared: date(p.prepared) })),
        }
      : null,
    buildFailure: s.buildFailure
      ? { ...s.buildFailure, nextAttemptAt: date(s.buildFailure.nextAttemptAt) }
      : null,
    drainFailure: s.drainFailure
      ? {
          ...s.drainFailure,
          since: date(s.drainFailure.since),
          lastSeen: date(s.drainFailure.lastSeen),
        }
      : null,
    backfill: s.backfill
      ? {
          ...s.backfill,
          startedAt: date(s.backfill.startedAt),
          rate: s.backfill.rate ?? null,
          etaSeconds: s.backfill.etaSeconds ?? null,
        }
      : null,
    lastApply: s.lastApply
      ? { ...s.lastApply, keys: Number(s.lastApply.keys), at: date(s.lastApply.at) }
      : null,
    restored: s.restored ? { ...s.restored, detectedAt: maybeDate(s.restored.detectedAt) } : null,
    redefinition: s.redefinition
      ? {
          ...s.redefinition,
          error: s.redefinition.error ?? null,
          lockMs: s.redefinition.lockMs ?? null,
          readersBlockedMs:
            s.redefinition.readersBlockedMs == null
              ? null
              : Number(s.redefinition.readersBlockedMs),
          staged: s.redefinition.staged ?? null,
          since: maybeDate(s.redefinition.since ?? null),
          at: maybeDate(s.redefinition.at ?? null),
        }
      : null,
    workers: workerHealthOf(s.workers),
    workerFailure: workerFailureOf(s.workerFailure),
  };
}

/**
 * The lifecycle status() reports, from the catalog's facts, for the metrics and events
 * snapshot (observe/catalog-snapshot.ts). `<schema>.status()` (SQL) derives it the same
 * way: change both together.
 */
export function deriveLifecycle(facts: {
  paused: boolean;
  phase: Exclude<Lifecycle, 'paused' | 'unverified'>;
  /** The catalog is another database's (restored or cloned), not rebound yet. */
  restored?: boolean;
  /** Partitions of a source are being corrected for it. */
  correcting: boolean;
  /** It reads a column that is paused upstream. */
  upstreamPausedColumns: boolean;
  /** A transform upstream (at any depth) is paused or not live. */
  upstreamBehind: boolean;
}): Lifecycle {
  let status: Lifecycle = facts.paused ? 'paused' : facts.phase;
  // Rows that came or went without DML are being re-derived: a build, of a part of it.
  if ((status === 'live' || status === 'catching_up') && facts.correcting) {
    status = 'backfilling';
  }
  // A live transform reading a paused upstream column, or reading a target that is still
  // being built, is not keeping up with its sources.
  if (status === 'live' && (facts.upstreamPausedColumns || facts.upstreamBehind)) {
    status = 'catching_up';
  }
  // A target of a database restored or cloned is not live until rebuilt here (ADR 0035).
  if (facts.restored && status !== 'paused') status = 'unverified';
  return status;
}
