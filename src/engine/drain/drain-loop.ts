import type { ConnectionPool } from '../db/pool.js';
import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import type { Logger } from '../logger.js';
import type { LoopHealth } from '../workers/health.js';
import { WorkerLoop } from '../workers/worker-loop.js';
import { backfillChunk } from './backfill.js';
import { applyPage } from './pages.js';
import { PlanCache } from './plan-cache.js';
import { openRange } from './ranges.js';
import type { AppliedWork } from './tally.js';

/**
 * After a step that found nothing although work was announced (another loop took it),
 * the pause before looking again: starts short, grows to this.
 */
const MAX_IDLE_MS = 50;

/** Longest single wait for work (one statement, see `<schema>._await_drain_work`). */
const IDLE_WAIT_MS = 5_000;

/**
 * How often that wait looks for work during its first FAST_MS (while writes keep coming,
 * the next tick is at most 50 ms away); after that the pause grows to MAX_POLL_MS.
 */
const POLL_MS = 10;
const FAST_MS = 200;
const MAX_POLL_MS = 50;

/**
 * A loop busy with live ranges still gives backfills a turn this often: ranges come with
 * every tick, and without turns a build would wait for a quiet moment that may not come.
 */
const BACKFILL_TURN_MS = 100;

/**
 * The drain loops of one process wait for work together: one of them waits in Postgres,
 * the others wait for its answer. So an idle process costs one waiting backend, however
 * many loops it runs. A loop whose wait fails (its session lost, say) gets the error; the
 * others go and look for work themselves.
 */
export class SharedWait {
  private inFlight: Promise<boolean> | undefined;

  async wait(look: () => Promise<boolean>): Promise<boolean> {
    if (this.inFlight) {
      try {
        return await this.inFlight;
      } catch {
        return true;
      }
    }
    const mine = look();
    this.inFlight = mine;
    try {
      return await mine;
    } finally {
      if (this.inFlight === mine) this.inFlight = undefined;
    }
  }
}

/**
 * One drain loop: applies open pages, opens ranges for transforms that are behind, and
 * fills backfilling targets chunk by chunk. Any number of loops in any number of
 * processes share the work through row locks (FOR UPDATE SKIP LOCKED); each holds a
 * shared advisory lock for as long as its session lives, which is what
 * hasLiveDrainWorkers() looks for.
 *
 * With nothing to do, a loop waits for work inside one statement (`_await_drain_work`),
 * which returns soon after work appears (within POLL_MS, or MAX_POLL_MS after a while) and
 * otherwise after IDLE_WAIT_MS: an idle loop makes a commit every few seconds, not one per
 * poll; and the loops of a process share that wait (SharedWait).
 */
export class DrainLoop {
  private readonly loop: WorkerLoop;
  /** The last step found nothing: wait for work before the next. */
  private waiting = false;
  private idleMs = 1;
  private nextBackfillTurn = 0;
  private readonly plans: PlanCache;

  constructor(
    pool: ConnectionPool,
    private readonly schema: string,
    private readonly log: Logger,
    signal: AbortSignal,
    index: number,
    private readonly shared: SharedWait = new SharedWait(),
    /** Told what each page (or small range) applied did (metrics). */
    private readonly onApplied: (work: AppliedWork) => void = () => undefined,
  ) {
    this.plans = new PlanCache(schema);
    this.loop = new WorkerLoop({
      name: `drain loop ${index}`,
      pool,
      log,
      signal,
      onSession: (session) => this.register(session),
      step: (session) => this.step(session),
    });
  }

  get done(): Promise<void> {
    return this.loop.done;
  }

  /** Connected and registered (hasLiveDrainWorkers sees it). */
  get alive(): boolean {
    return this.loop.connected;
  }

  /** How it fares, for the process registry (ADR 0038). */
  health(): LoopHealth {
    return this.loop.health();
  }

  interrupt(): void {
    this.loop.interrupt();
  }

  private async register(session: Session): Promise<void> {
    await session.query('SELECT pg_advisory_lock_shared($1, hashtext($2))', [
      LOCK_CLASS.drain,
      this.schema,
    ]);
  }

  private async step(session: Session): Promise<number> {
    if (this.waiting) {
      const work = await this.shared.wait(async () => {
        const [row] = await session.query<{ work: boolean }>(
          `SELECT ${quoteIdent(this.schema)}._await_drain_work($1, $2, $3, $4) AS work`,
          [IDLE_WAIT_MS, POLL_MS, MAX_POLL_MS, FAST_MS],
        );
        return row?.work === true;
      });
      if (!work) return 0;
      this.waiting = false;
    }
    if (Date.now() >= this.nextBackfillTurn && (await this.backfill(session))) return this.busy();
    const page = await applyPage(session, this.schema, this.plans, this.log);
    if (page) {
      this.onApplied(page);
      return this.busy();
    }
    const range = await openRange(session, this.schema, this.plans, this.log);
    if (range.applied) this.onApplied(range.applied);
    if (range.result !== 'none') return this.busy();
    if (await this.backfill(session)) return this.busy();
    return this.idle();
  }

  /** One backfill chunk, if any target is backfilling; the next turn comes after other work. */
  private async backfill(session: Session): Promise<boolean> {
    const filled = await backfillChunk(session, this.schema, this.plans, this.log);
    this.nextBackfillTurn = Date.now() + BACKFILL_TURN_MS;
    return filled;
  }

  private busy(): number {
    this.idleMs = 1;
    return 0;
  }

  /**
   * Nothing found: wait for work next. After a pause that grows while work is announced
   * and not found (other loops take it), so a loop never spins on another's work.
   */
  private idle(): number {
    this.waiting = true;
    this.idleMs = Math.min(MAX_IDLE_MS, this.idleMs * 2);
    return this.idleMs;
  }
}
