import type { Session } from '../db/session.js';
import type { Logger } from '../logger.js';

/** What a running check works with; shared by the files of the check. */

/** A check that cannot go on: `cancelled` (paused, rebuilt), `failed`, or `gone` (dropped). */
export class CheckStopped extends Error {
  constructor(
    readonly state: 'cancelled' | 'failed' | 'gone',
    message: string,
  ) {
    super(message);
  }
}

export interface CheckContext {
  session: Session;
  /** Another session, for a moment (the caller releases it): for work beside a transaction. */
  acquire(): Promise<Session>;
  schema: string;
  log: Logger;
  signal: AbortSignal;
  /** When the check must have finished (ms since the epoch). */
  deadline: number;
  /** Records progress; `total` once known. */
  progress(rowsCompared: number, total?: number): Promise<void>;
}

/** A target key, as the texts of its columns (null: NULL). */
export type Key = Array<string | null>;

/** Fails the check once the handle stops or the job's time is up. */
export function checkTime(ctx: CheckContext): void {
  if (ctx.signal.aborted) throw new CheckStopped('failed', 'the handle shut down');
  if (Date.now() > ctx.deadline) {
    throw new CheckStopped(
      'failed',
      'the check ran out of time (a job may run for about an hour): check a sample instead',
    );
  }
}
