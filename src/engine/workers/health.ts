/**
 * The health of a process's background workers, as its loops know it and as the process
 * reports it to the catalog (`<schema>.processes.health`, ADR 0038). Times are ISO text
 * (the process's clock): this is what goes into the catalog's JSON as it is.
 */

/** A step that failed: what the loop logged. */
export interface LoopError {
  message: string;
  /** The TrellisError code it was classified as. */
  code: string;
  sqlstate: string | null;
  at: string;
}

/** One loop: when it last completed a step, and the failures since. */
export interface LoopHealth {
  /** `pg_backend_pid()` of its session, once it has one (what pg_locks shows for its locks). */
  backendPid: number | null;
  /** It has a session and has taken its locks. */
  connected: boolean;
  /** The last step that completed (an idle wait counts: the loop is going round). */
  lastPassAt: string | null;
  /** The first failure of the current run of failures; null after a step completes. */
  failingSince: string | null;
  /** Failures in a row. */
  failures: number;
  /** The latest failure, kept after the loop recovers (with its time). */
  lastError: LoopError | null;
}

/** The staging worker or WAL decoder: one loop, and whether it is the elected one. */
export interface ElectedHealth extends LoopHealth {
  elected: boolean;
}

/** The drain loops of a process, together. */
export interface DrainHealth {
  loops: number;
  /** Loops connected and registered. */
  alive: number;
  /** Loops whose last step failed. */
  failing: number;
  lastPassAt: string | null;
  /** When the last of the loops began failing, while every one of them fails. */
  failingSince: string | null;
  lastError: LoopError | null;
}

/** What a process reports of its workers. */
export interface ProcessHealth {
  staging?: ElectedHealth;
  decoder?: ElectedHealth;
  drain?: DrainHealth;
  /** Set once the process stopped its workers on a schema it cannot run on. */
  refused?: { code: string; message: string; at: string };
}

function latest(values: Array<string | null>): string | null {
  return values.reduce<string | null>(
    (a, b) => (b !== null && (a === null || b > a) ? b : a),
    null,
  );
}

/** The drain loops of a process, summed up. */
export function drainHealth(loops: LoopHealth[]): DrainHealth {
  const failing = loops.filter((l) => l.failingSince !== null);
  const errors = loops.map((l) => l.lastError).filter((e): e is LoopError => e !== null);
  return {
    loops: loops.length,
    alive: loops.filter((l) => l.connected).length,
    failing: failing.length,
    lastPassAt: latest(loops.map((l) => l.lastPassAt)),
    failingSince:
      failing.length === loops.length ? latest(failing.map((l) => l.failingSince)) : null,
    lastError: errors.reduce<LoopError | null>((a, b) => (a === null || b.at > a.at ? b : a), null),
  };
}

/**
 * What changes in a report when something an operator would want to know changes: a
 * loop elected or not, connected or not, its first pass, starting or ending a run of
 * failures, a new error. Not the time of each pass, nor the count of failures (those go out with the
 * periodic heartbeat): a busy process would otherwise write on every step.
 */
export function healthSignature(health: ProcessHealth): string {
  const loop = (h: LoopHealth | undefined) =>
    h && {
      backendPid: h.backendPid,
      connected: h.connected,
      passed: h.lastPassAt !== null,
      failing: h.failingSince !== null,
      error: h.lastError?.message ?? null,
    };
  return JSON.stringify({
    staging: health.staging && { ...loop(health.staging), elected: health.staging.elected },
    decoder: health.decoder && { ...loop(health.decoder), elected: health.decoder.elected },
    drain: health.drain && {
      passed: health.drain.lastPassAt !== null,
      alive: health.drain.alive,
      failing: health.drain.failing,
      error: health.drain.lastError?.message ?? null,
    },
    refused: health.refused?.message ?? null,
  });
}
