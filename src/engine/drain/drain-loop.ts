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
import { takeEnteredTransform } from './work-settings.js';

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

/** How often a busy loop records the drain time it spent per transform (`<schema>._drained`). */
const RECORD_MS = 1_000;

/** The kinds of work a step can do, in the order tried when none ranks first. */
type WorkKind = 'page' | 'range' | 'build';
const KINDS: readonly WorkKind[] = ['page', 'range', 'build'];

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
 *
 * Work is taken fairly across transforms (ADR 0045): each step first does the kind of
 * work (a page, a range to open, a build's chunk or step) of the transform that no loop is
 * serving now and that had the least drain time lately (`<schema>._drain_next`), and each
 * claim prefers such a transform's work too; so one transform's heavy pages or build never
 * hold every loop while others wait. The time a step spent is recorded per transform
 * (`<schema>.drain_time`, status().drain).
 */
export class DrainLoop {
  private readonly loop: WorkerLoop;
  /** The last step found nothing: wait for work before the next. */
  private waiting = false;
  private idleMs = 1;
  private readonly plans: PlanCache;
  /** Drain seconds spent per transform, not recorded yet. */
  private readonly spent = new Map<number, number>();
  /** Changed keys applied per transform, not recorded yet (the page's charts, ADR 0054). */
  private readonly applied = new Map<number, number>();
  /** Changed keys the last unit of work applied. */
  private lastKeys = 0;
  private recordedAt = Date.now();

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
    const first = await this.nextKind(session);
    for (const kind of first ? [first, ...KINDS.filter((k) => k !== first)] : KINDS) {
      const started = performance.now();
      takeEnteredTransform(session);
      this.lastKeys = 0;
      const worked = await this.work(kind, session);
      const transformId = takeEnteredTransform(session);
      if (transformId !== undefined) {
        const seconds = (performance.now() - started) / 1000;
        this.spent.set(transformId, (this.spent.get(transformId) ?? 0) + seconds);
        if (this.lastKeys > 0) {
          this.applied.set(transformId, (this.applied.get(transformId) ?? 0) + this.lastKeys);
        }
      }
      if (worked) {
        if (Date.now() - this.recordedAt >= RECORD_MS) await this.record(session);
        return this.busy();
      }
    }
    await this.record(session);
    return this.idle();
  }

  /** The kind of work whose transform ranks first (least served lately), or null. */
  private async nextKind(session: Session): Promise<WorkKind | null> {
    const [row] = await session.query<{ kind: WorkKind | null }>(
      `SELECT ${quoteIdent(this.schema)}._drain_next() AS kind`,
    );
    return row?.kind ?? null;
  }

  /** One unit of work of `kind`, if there is one; says whether it found some. */
  private async work(kind: WorkKind, session: Session): Promise<boolean> {
    if (kind === 'build') return backfillChunk(session, this.schema, this.plans, this.log);
    if (kind === 'page') {
      const page = await applyPage(session, this.schema, this.plans, this.log);
      if (page) this.countApplied(page);
      return page !== null;
    }
    const range = await openRange(session, this.schema, this.plans, this.log);
    if (range.applied) this.countApplied(range.applied);
    return range.result !== 'none';
  }

  /** A page or range applied: told to the metrics, its keys counted for the catalog. */
  private countApplied(work: AppliedWork): void {
    if (!work.failed) this.lastKeys += work.keys;
    this.onApplied(work);
  }

  /**
   * Records the drain time spent and the changed keys applied per transform since the last
   * time (status().drain, the operations page's keys per second).
   */
  private async record(session: Session): Promise<void> {
    this.recordedAt = Date.now();
    if (this.spent.size === 0) return;
    const ids = [...this.spent.keys()];
    const seconds = ids.map((id) => this.spent.get(id) ?? 0);
    const keys = ids.map((id) => this.applied.get(id) ?? 0);
    this.spent.clear();
    this.applied.clear();
    await session.query(
      `SELECT ${quoteIdent(this.schema)}._drained($1::int[], $2::float8[], $3::bigint[])`,
      [ids, seconds, keys],
    );
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
