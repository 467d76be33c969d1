import type { ConnectionPool } from '../db/pool.js';
import type { Session } from '../db/session.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import type { Logger } from '../logger.js';
import { WorkerLoop } from '../workers/worker-loop.js';
import { backfillChunk } from './backfill.js';
import { applyPage } from './pages.js';
import { PlanCache } from './plan-cache.js';
import { hasDrainWork, openRange } from './ranges.js';

/** Idle polling: starts fast after work, slows to this while there is none. */
const MAX_IDLE_MS = 50;

/**
 * A loop busy with live ranges still gives backfills a turn this often: ranges come with
 * every tick, and without turns a build would wait for a quiet moment that may not come.
 */
const BACKFILL_TURN_MS = 100;

/**
 * One drain loop: applies open pages, opens ranges for transforms that are behind, and
 * fills backfilling targets chunk by chunk. Any number of loops in any number of
 * processes share the work through row locks (FOR UPDATE SKIP LOCKED); each holds a
 * shared advisory lock for as long as its session lives, which is what
 * hasLiveDrainWorkers() looks for.
 */
export class DrainLoop {
  private readonly loop: WorkerLoop;
  private idleMs = 1;
  private nextBackfillTurn = 0;
  private readonly plans: PlanCache;

  constructor(
    pool: ConnectionPool,
    private readonly schema: string,
    private readonly log: Logger,
    signal: AbortSignal,
    index: number,
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
    if (this.idleMs > 1 && !(await hasDrainWork(session, this.schema))) return this.idle();
    if (Date.now() >= this.nextBackfillTurn && (await this.backfill(session))) return this.busy();
    if (await applyPage(session, this.schema, this.plans, this.log)) return this.busy();
    const opened = await openRange(session, this.schema, this.plans, this.log);
    if (opened === 'opened') return this.busy();
    // Moving a cursor over an empty range is cheap; keepalive ticks make many of them.
    if (opened === 'advanced') return 0;
    if (await this.backfill(session)) return this.busy();
    return this.idle();
  }

  /** One backfill chunk, if any target is backfilling; the next turn comes after other work. */
  private async backfill(session: Session): Promise<boolean> {
    const filled = await backfillChunk(session, this.schema, this.log);
    this.nextBackfillTurn = Date.now() + BACKFILL_TURN_MS;
    return filled;
  }

  private busy(): number {
    this.idleMs = 1;
    return 0;
  }

  /** Idle polling: starts fast after work, slows down while there is none. */
  private idle(): number {
    this.idleMs = Math.min(MAX_IDLE_MS, this.idleMs * 2);
    return this.idleMs;
  }
}
