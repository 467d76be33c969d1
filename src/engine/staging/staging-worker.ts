import { CaptureReconciler } from '../capture/reconcile.js';
import type { ConnectionPool } from '../db/pool.js';
import type { Session } from '../db/session.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import type { Logger } from '../logger.js';
import { WorkerLoop } from '../workers/worker-loop.js';
import { startBackfills } from './backfill-start.js';
import { detectDisruptions } from './disruptions.js';
import { maintainLedger } from './ledger-maintenance.js';
import { LedgerSummaries } from './ledger-summaries.js';
import { correctionStep, trackMembers } from './partition-corrections.js';
import { checkSourceChanges } from './source-changes.js';
import { tick } from './ticker.js';
import { settleWidenWaits } from './widen-wait.js';

export interface StagingTimings {
  /** Between ticks. */
  tickMs: number;
  /** Between capture reconciliations (and backfill starts). */
  reconcileMs: number;
  /** Between ledger rotation/truncation passes. */
  maintenanceMs: number;
  /** Between attempts of a standby to take over. */
  standbyMs: number;
}

export const STAGING_TIMINGS: StagingTimings = {
  tickMs: 50,
  reconcileMs: 200,
  maintenanceMs: 1_000,
  standbyMs: 500,
};

/**
 * The instance's staging worker: ticks (sealing ledger segments), installs and adjusts
 * capture, starts backfills, and keeps the ledger small. One per instance, elected by a
 * session-level advisory lock; a second `staging: true` handle waits as a standby and
 * takes over when the leader's session ends.
 */
export class StagingWorker {
  private readonly loop: WorkerLoop;
  private leaderPid: number | undefined;
  private nextReconcile = 0;
  private nextMaintenance = 0;
  private readonly capture: CaptureReconciler;
  private readonly summaries: LedgerSummaries;

  constructor(
    pool: ConnectionPool,
    private readonly schema: string,
    private readonly log: Logger,
    signal: AbortSignal,
    private readonly timings: StagingTimings = STAGING_TIMINGS,
  ) {
    this.capture = new CaptureReconciler(schema, log);
    this.summaries = new LedgerSummaries(schema, log);
    this.loop = new WorkerLoop({
      name: 'staging worker',
      pool,
      log,
      signal,
      onSession: async () => {
        this.leaderPid = undefined;
      },
      step: (session) => this.step(session),
    });
  }

  get done(): Promise<void> {
    return this.loop.done;
  }

  interrupt(): void {
    this.loop.interrupt();
  }

  private async step(session: Session): Promise<number> {
    if (this.leaderPid === undefined) {
      const [row] = await session.query<{ leader: boolean; pid: number }>(
        'SELECT pg_try_advisory_lock($1, hashtext($2)) AS leader, pg_backend_pid() AS pid',
        [LOCK_CLASS.staging, this.schema],
      );
      if (!row?.leader) return this.timings.standbyMs;
      this.leaderPid = row.pid;
      this.nextReconcile = 0;
      this.log.info({ pid: row.pid }, 'staging worker elected');
    }
    if ((await tick(session, this.schema)) !== null) {
      await this.summaries.summarize(session);
    }
    const now = Date.now();
    if (now >= this.nextReconcile) {
      this.nextReconcile = now + this.timings.reconcileMs;
      // A session the driver silently reconnected has lost the lock: stand down.
      const [same] = await session.query<{ same: boolean }>(
        'SELECT pg_backend_pid() = $1 AS same',
        [this.leaderPid],
      );
      if (!same?.same) {
        this.leaderPid = undefined;
        return 0;
      }
      // DDL first: transforms it broke stop before capture is narrowed to the table as it is.
      await checkSourceChanges(session, this.schema, this.log);
      await detectDisruptions(session, this.schema, this.log);
      await trackMembers(session, this.schema, this.log);
      await this.capture.reconcile(session);
      await correctionStep(session, this.schema);
      await settleWidenWaits(session, this.schema, this.log);
      const started = await startBackfills(session, this.schema);
      for (const target of started) this.log.info({ target }, 'backfill started');
    }
    if (now >= this.nextMaintenance) {
      this.nextMaintenance = now + this.timings.maintenanceMs;
      await maintainLedger(session, this.schema, this.log);
    }
    return this.timings.tickMs;
  }
}
