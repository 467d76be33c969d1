import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type {
  DrainWorkers,
  ElectedWorker,
  ProcessInfo,
  WorkerError,
  WorkerFailure,
  WorkerHealth,
} from './status-types.js';

/** A shape as `<schema>.workers()` returns it in JSON: its Dates as ISO text. */
type Json<T> = {
  [K in keyof T]: T[K] extends Date
    ? string
    : T[K] extends Date | null
      ? string | null
      : T[K] extends WorkerError | null
        ? Json<WorkerError> | null
        : T[K];
};

const maybeDate = (text: string | null | undefined): Date | null =>
  text === null || text === undefined ? null : new Date(text);

function error(e: Json<WorkerError> | null | undefined): WorkerError | null {
  return e ? { ...e, at: new Date(e.at) } : null;
}

function elected(w: Json<ElectedWorker>): ElectedWorker {
  return {
    ...w,
    lastPassAt: maybeDate(w.lastPassAt),
    failingSince: maybeDate(w.failingSince),
    lastError: error(w.lastError),
  };
}

function drain(w: Json<DrainWorkers>): DrainWorkers {
  return {
    ...w,
    lastPassAt: maybeDate(w.lastPassAt),
    failingSince: maybeDate(w.failingSince),
    lastError: error(w.lastError),
  };
}

export type WorkerHealthJson = Omit<WorkerHealth, 'staging' | 'decoder' | 'drain' | 'processes'> & {
  staging: Json<ElectedWorker>;
  decoder: Json<ElectedWorker> | null;
  drain: Json<DrainWorkers>;
  processes: Array<Json<ProcessInfo>>;
};

export type WorkerFailureJson = Json<WorkerFailure>;

/** `<schema>.workers()`'s JSON with its times as Dates. */
export function workerHealthOf(json: WorkerHealthJson): WorkerHealth {
  return {
    schemaVersion: json.schemaVersion,
    staging: elected(json.staging),
    decoder: json.decoder ? elected(json.decoder) : null,
    drain: drain(json.drain),
    processes: json.processes.map((p) => ({
      ...p,
      startedAt: new Date(p.startedAt),
      heartbeatAt: new Date(p.heartbeatAt),
    })),
  };
}

export function workerFailureOf(json: WorkerFailureJson | null): WorkerFailure | null {
  return json ? { ...json, since: maybeDate(json.since) } : null;
}

/**
 * The instance's workers and the processes that run them: what `<schema>.workers()`
 * returns (migration 0025, callable from psql).
 */
export async function readWorkers(session: Session, schema: string): Promise<WorkerHealth> {
  const [row] = await session.query<{ workers: WorkerHealthJson }>(
    `SELECT ${quoteIdent(schema)}.workers() AS workers`,
  );
  return workerHealthOf(row!.workers);
}
