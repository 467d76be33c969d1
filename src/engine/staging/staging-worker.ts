import { CaptureReconciler } from '../capture/reconcile.js';
import { checkSlot, detectWalDisruptions } from '../capture/wal/slot-safety.js';
import type { ConnectionPool } from '../db/pool.js';
import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import type { Logger } from '../logger.js';
import type { ElectedHealth } from '../workers/health.js';
import { WorkerLoop } from '../workers/worker-loop.js';
import { startBackfills } from './backfill-start.js';
import { detectDisruptions } from './disruptions.js';
import { refillFollowed } from './follow-refill.js';
import { maintainLedger } from './ledger-maintenance.js';
import { LedgerSummaries } from './ledger-summaries.js';
import { correctionStep, trackMembers } from './partition-corrections.js';
import { switchRedefinitions } from './redefine-switch.js';
import { checkSourceChanges } from './source-changes.js';
import { KEEPALIVE_TICK_MS, tick } from './ticker.js';
import { settleWidenWaits } from './widen-wait.js';

export interface StagingTimings {
  /** At least this long between ticks: a busy ledger is sealed in segments about this long. */
  tickMs: number;
  /**
   * Between reconcile passes when nothing they read has changed (a safety net: a change
   * to what they read is seen within a poll, see `_capture_fingerprint`).
   */
  reconcileMs: number;
  /**
   * Between reconcile passes while one has something to come back to (a backfill not
   * started, a widen wait), and between checks for changes while ticks keep coming.
   */
  pendingReconcileMs: number;
  /**
   * Ledger maintenance (rotation, truncation, old ticks) runs when the oldest cursor has
   * moved since its last pass, at most this often; and again this soon after a TRUNCATE it
   * had to leave for later.
   */
  maintenanceMs: number;
  /** Between ledger maintenance passes otherwise (a safety net). */
  idleMaintenanceMs: number;
  /** Longest single wait for work (one statement, see `<schema>._await_staging_work`). */
  idleWaitMs: number;
  /** How often that wait looks for work during its first fastMs. */
  pollMs: number;
  fastMs: number;
  /** After that, the pause grows to this (what a write after idle time may wait). */
  maxPollMs: number;
  /** Between attempts of a standby to take over. */
  standbyMs: number;
  /**
   * Between samples of every transform's lag and applied keys (`<schema>.samples`, kept
   * for an hour: the operations page's charts, ADR 0054); written only for transforms
   * that changed since their latest sample (ADR 0063).
   */
  sampleMs: number;
}

export const STAGING_TIMINGS: StagingTimings = {
  tickMs: 50,
  reconcileMs: 30_000,
  pendingReconcileMs: 200,
  maintenanceMs: 1_000,
  idleMaintenanceMs: 30_000,
  idleWaitMs: 5_000,
  pollMs: 10,
  fastMs: 200,
  maxPollMs: 50,
  standbyMs: 500,
  sampleMs: 10_000,
};

type Wake = 'tick' | 'capture' | 'maintain' | 'timeout' | 'due';

/** What the staging worker tells the handle's metrics and catalog watch. */
export interface StagingHooks {
  tickSealed(): void;
  /**
   * At the end of each pass of the elected worker, on its session: the catalog watch
   * reads its snapshot there when the last one is older than a second. Must not throw.
   */
  afterPass(session: Session): Promise<void>;
}

const NO_HOOKS: StagingHooks = { tickSealed: () => undefined, afterPass: async () => undefined };

/**
 * The instance's staging worker: ticks (sealing ledger segments), installs and adjusts
 * capture, starts backfills, and keeps the ledger small. One per instance, elected by a
 * session-level advisory lock; a second `staging: true` handle waits as a standby and
 * takes over when the leader's session ends.
 *
 * Idle, it costs next to nothing: it waits for work inside one statement
 * (`_await_staging_work`), which returns as soon as captured changes commit (a tick is
 * due) or what capture depends on changes (a transform defined, a partition created…),
 * and otherwise after `idleWaitMs`. No tick is taken while nothing is written.
 */
export class StagingWorker {
  private readonly loop: WorkerLoop;
  private leaderPid: number | undefined;
  private nextReconcile = 0;
  private nextMaintenance = 0;
  private nextSample = 0;
  /** When this election's last sample pass ran (the database's clock), for the next. */
  private lastSampleAt: string | null = null;
  private lastMaintenance = 0;
  /** The oldest cursor the last maintenance pass worked from. */
  private maintainedFloor: string | null = null;
  private lastTickAt = 0;
  /** The last step took a tick: writes are coming, try the next without waiting. */
  private ticking = false;
  /** Whether this election checked for a restored database (ADR 0035). */
  private restoreChecked = false;
  /** While ticking: when the tick next checks what capture depends on. */
  private nextCaptureCheck = 0;
  /** What capture depended on when it was last reconciled (`_capture_fingerprint()`). */
  private fingerprint: string | null = null;
  /** Some redefinition was not switched yet on the last pass (ADR 0055): come back soon. */
  private redefining = false;
  private readonly capture: CaptureReconciler;
  private readonly summaries: LedgerSummaries;

  constructor(
    pool: ConnectionPool,
    private readonly schema: string,
    private readonly log: Logger,
    signal: AbortSignal,
    private readonly timings: StagingTimings = STAGING_TIMINGS,
    private readonly hooks: StagingHooks = NO_HOOKS,
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

  /** This process runs the instance's elected staging worker now (metrics, logging). */
  get isLeader(): boolean {
    return this.leaderPid !== undefined && this.loop.connected;
  }

  /** How it fares, for the process registry (ADR 0038). */
  health(): ElectedHealth {
    return { ...this.loop.health(), elected: this.isLeader };
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
      this.fingerprint = null;
      this.ticking = false;
      this.lastSampleAt = null;
      this.log.info({ pid: row.pid }, 'staging worker elected');
      this.restoreChecked = false;
    }
    if (!this.restoreChecked) {
      // A database restored from a logical dump or cloned holds another database's
      // catalog: rebound by name and every transform rebuilt before anything else runs
      // on it (ADR 0035).
      const [restore] = await session.query<{ reason: string | null }>(
        `SELECT ${quoteIdent(this.schema)}._recognise_restore() AS reason`,
      );
      if (restore?.reason) {
        this.log.warn(
          { reason: restore.reason },
          `${restore.reason}: tables rebound by name, every transform is rebuilt`,
        );
      }
      this.restoreChecked = true;
    }
    const sinceTick = Date.now() - this.lastTickAt;
    if (sinceTick < this.timings.tickMs) return this.timings.tickMs - sinceTick;

    // While ticks keep being taken, try the next one at once (the tick itself tells
    // whether capture needs reconciling); otherwise wait for work in one statement.
    const due = Math.min(
      this.nextReconcile,
      this.nextMaintenance,
      this.nextSample,
      this.capture.nextRetryAt(),
    );
    const wake: Wake = this.ticking ? 'tick' : await this.awaitWork(session, due - Date.now());
    const now = Date.now();
    let maintain = wake === 'maintain' || now >= this.nextMaintenance;
    let reconcile = wake === 'capture' || now >= this.nextReconcile;
    reconcile ||= now >= this.capture.nextRetryAt();
    let backfills = false;
    // A pass that found other work already due (it did not wait for work, so nothing told
    // it whether a tick is due) checks for one too: passes longer than the interval they
    // set themselves (reconciling while a build waits, under load) were each due at once,
    // and no tick was ever taken, so a build waiting for its first tick never started
    // (issue #24, ADR 0063). The tick's statement inserts nothing when none is needed.
    if (wake === 'tick' || wake === 'due') {
      const check = now >= this.nextCaptureCheck;
      const ticked = await tick(session, this.schema, check);
      this.ticking = ticked.seq !== null;
      if (check) {
        this.nextCaptureCheck = now + this.timings.pendingReconcileMs;
        reconcile ||= ticked.fingerprint !== this.fingerprint;
      }
      // A backfill waits for a tick taken after its capture is in place.
      backfills = ticked.waiting;
      maintain ||= this.mayMaintain(now) && ticked.floor !== this.maintainedFloor;
      if (ticked.seq !== null) {
        this.lastTickAt = now;
        this.hooks.tickSealed();
        await this.summaries.summarize(session);
      }
    }
    if (reconcile) {
      // A session the driver silently reconnected has lost the lock: stand down.
      const [same] = await session.query<{ same: boolean; fingerprint: string }>(
        `SELECT pg_backend_pid() = $1 AS same, ${quoteIdent(this.schema)}._capture_fingerprint() AS fingerprint`,
        [this.leaderPid],
      );
      if (!same?.same) {
        this.leaderPid = undefined;
        return 0;
      }
      // DDL first: transforms it broke stop before capture is narrowed to the table as it is.
      await checkSourceChanges(session, this.schema, this.log);
      await detectDisruptions(session, this.schema, this.log);
      await detectWalDisruptions(session, this.schema, this.log);
      await checkSlot(session, this.schema, this.log);
      await trackMembers(session, this.schema, this.log);
      await this.capture.reconcile(session);
      // A redefinition switched may leave a chain reading its target to follow (ADR 0055).
      this.redefining = await switchRedefinitions(session, this.schema, this.log);
      await refillFollowed(session, this.schema, this.log);
      await correctionStep(session, this.schema);
      await settleWidenWaits(session, this.schema, this.log);
      // Read before this pass: a change made since (this pass's own included) is seen by
      // the next wait, and brings one more pass.
      this.fingerprint = same.fingerprint;
    }
    if (reconcile || backfills) {
      const started = await startBackfills(session, this.schema);
      // Their state change (backfilling) is logged by the catalog watch.
      for (const target of started) this.log.debug({ target }, 'backfill started');
    }
    if (reconcile) {
      // What this pass left to come back to soon, whatever else changes.
      const [left] = await session.query<{ pending: boolean }>(
        `SELECT ${quoteIdent(this.schema)}._capture_pending() AS pending`,
      );
      // From the pass's end, not its start: a pass longer than the interval leaves time to
      // wait for work (and take ticks) before the next one.
      this.nextReconcile =
        Date.now() +
        (left?.pending || this.redefining
          ? this.timings.pendingReconcileMs
          : this.timings.reconcileMs);
    }
    if (maintain) {
      // The slot's retained WAL grows while nothing else happens: checked here too.
      await checkSlot(session, this.schema, this.log);
      const done = await maintainLedger(session, this.schema, this.log);
      this.log.debug({ floor: done.floor, skipped: done.skipped }, 'ledger maintenance pass');
      this.lastMaintenance = now;
      this.maintainedFloor = done.floor;
      this.nextMaintenance =
        now + (done.skipped ? this.timings.maintenanceMs : this.timings.idleMaintenanceMs);
    }
    if (now >= this.nextSample) {
      // A row per transform that changed since its latest sample (and, after a quiet
      // stretch, the previous pass's view of it): an idle instance writes nothing (ADR 0063).
      const [sampled] = await session.query<{ written: number; at: string }>(
        `SELECT written, at::text AS at FROM ${quoteIdent(this.schema)}._sample($1::timestamptz)`,
        [this.lastSampleAt],
      );
      this.lastSampleAt = sampled?.at ?? null;
      this.log.debug({ written: sampled?.written ?? 0 }, 'samples taken');
      this.nextSample = now + this.timings.sampleMs;
    }
    await this.hooks.afterPass(session);
    return 0;
  }

  /** Maintenance ran long enough ago to run again on a moved cursor. */
  private mayMaintain(now: number): boolean {
    return now - this.lastMaintenance >= this.timings.maintenanceMs;
  }

  /**
   * Waits, in one statement, until a tick is due, capture has something to reconcile, the
   * oldest cursor moved (once maintenance may run again), or `ms` (at most idleWaitMs)
   * have passed. Nothing to wait for when `ms` is not positive.
   */
  private async awaitWork(session: Session, ms: number): Promise<Wake> {
    if (ms <= 0) return 'due';
    const now = Date.now();
    const watchFloor = this.mayMaintain(now);
    // Until maintenance may run again, wake up when it may, to watch from then on.
    if (!watchFloor) ms = Math.min(ms, this.lastMaintenance + this.timings.maintenanceMs - now);
    const [row] = await session.query<{ wake: Wake }>(
      `SELECT ${quoteIdent(this.schema)}._await_staging_work($1, $2, $3, $4, $5, $6, $7, $8) AS wake`,
      [
        this.fingerprint,
        this.maintainedFloor,
        watchFloor,
        KEEPALIVE_TICK_MS,
        Math.ceil(Math.min(ms, this.timings.idleWaitMs)),
        this.timings.pollMs,
        this.timings.maxPollMs,
        this.timings.fastMs,
      ],
    );
    return row?.wake ?? 'timeout';
  }
}
