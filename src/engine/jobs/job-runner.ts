import PgBoss from 'pg-boss';
import { classifyError } from '../db/classify.js';
import type { ConnectionConfig } from '../db/connection-config.js';
import { ConnectionPool } from '../db/pool.js';
import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import type { Logger } from '../logger.js';
import { sleep } from '../workers/sleep.js';
import { pooledDb, sessionDb } from './boss-db.js';
import { BOSS_SCHEMA_VERSION } from './boss-install-sql.js';
import type { JobQueue } from './queues.js';

/** What a job's handler gets besides the job: a stop signal and sessions of the jobs pool. */
export interface JobContext {
  /** Aborts when the handle shuts down: stop, and let the job be retried elsewhere. */
  signal: AbortSignal;
  /** A session of the jobs pool (release it when done). */
  acquire(): Promise<Session>;
  log: Logger;
}

/**
 * Works one job. Resolves when the job is done (whatever it found); rejects for pg-boss
 * to retry it later (a lost connection, a shutdown).
 */
export type JobHandler = (job: { id: string; data: unknown }, context: JobContext) => Promise<void>;

export interface JobRunnerOptions {
  jobsSchema: string;
  /** Work the queues (a handle with drain loops); otherwise only send. */
  work: boolean;
  queues: ReadonlyArray<{
    queue: JobQueue;
    handler: JobHandler;
    /**
     * Ids of the queue's active jobs whose worker is gone, their pg-boss rows locked for
     * the caller's transaction, which hands them back to pg-boss to retry now rather than
     * when they expire.
     */
    abandoned?: (session: Session) => Promise<string[]>;
  }>;
  applicationName: string;
  connectTimeoutMs: number;
}

/** How often an idle worker looks for jobs another process sent (its own wake it at once). */
const POLL_MS = 5_000;
/** How often a worker looks again for a jobs schema that is not installed (or not current). */
const INSTALL_RETRY_MS = 10_000;
/** The longest shutdown waits for a job's stop to be recorded (pg-boss then retries it). */
const STOP_RECORD_MS = 5_000;
/** How often a working handle looks for jobs whose worker is gone (see `abandoned`). */
const RECLAIM_MS = 5_000;
/** pg-boss maintenance (expire, archive, purge) on working handles; one runs per interval fleet-wide. */
const MAINTENANCE_SECONDS = 120;

/**
 * pg-boss inside the engine (ADR 0014). Every handle can send jobs: inside the calling
 * transaction, on the call's own session, so a job and the catalog row that tracks it
 * commit together. A handle with drain loops also works the queues, one job at a time, on
 * a pool of its own (two connections: the job's, and pg-boss's fetch, completion and
 * maintenance), and runs pg-boss's maintenance; a handle without drain loops starts
 * nothing, opens no connection and runs no timer. pg-boss's own `work()` is not used: it
 * does not wait for a job's completion to be recorded (a lost connection there would be
 * an unhandled rejection in the app) and cannot stop a job it started; the loop here does
 * both.
 */
export class JobRunner {
  private readonly sender: PgBoss;
  private readonly pool: ConnectionPool | undefined;
  private readonly controller = new AbortController();
  private wakeUp: (() => void) | undefined;
  private woken = false;
  private boss: PgBoss | undefined;
  private waitAnnounced = false;
  private lastReclaim = 0;
  private readonly done: Promise<void>;

  constructor(
    config: ConnectionConfig,
    private readonly options: JobRunnerOptions,
    private readonly log: Logger,
  ) {
    // Sends always pass the caller's session (`db`); this one is never used to connect.
    this.sender = this.newBoss(
      pooledDb(() =>
        Promise.reject(new TrellisError('unknown', 'a job was sent without a session')),
      ),
      false,
    );
    if (options.work) {
      this.pool = new ConnectionPool(config, {
        // A self-check's session, one it takes beside it for a moment (compare-batch.ts), and
        // pg-boss's statements.
        max: 3,
        applicationName: `${options.applicationName}:jobs`,
        // A safety net: a self-check's statements each cover one chunk of keys.
        statementTimeoutMs: 300_000,
        connectTimeoutMs: options.connectTimeoutMs,
        settings: { idle_in_transaction_session_timeout: '60000', work_mem: '64MB' },
      });
      // run() handles its own errors; this only keeps a bug there from going unhandled.
      this.done = this.run().catch((error: unknown) => {
        this.log.error({}, `jobs: the worker stopped: ${String(error)}`);
      });
    } else {
      this.done = Promise.resolve();
    }
  }

  private newBoss(db: PgBoss.Db, work: boolean): PgBoss {
    const boss = new PgBoss({
      db,
      schema: this.options.jobsSchema,
      // The install SQL (migrate(), or a migration) installs and upgrades the schema.
      migrate: false,
      supervise: work,
      maintenanceIntervalSeconds: MAINTENANCE_SECONDS,
      // No job runs on a schedule yet: pg-boss's cron would poll for nothing.
      schedule: false,
    });
    // Without a listener, an 'error' event pg-boss emits from a timer would be thrown.
    boss.on('error', (error: unknown) => {
      if (this.controller.signal.aborted) return;
      const classified = classifyError(error, { doing: 'pg-boss maintenance' });
      this.log.warn({ code: classified.code, sqlstate: classified.sqlstate }, classified.message);
    });
    return boss;
  }

  /**
   * Sends a job to `queue`, with the id `id`, on `session` (inside its transaction). A
   * worker in this process is woken when the transaction has committed (`wake`).
   */
  async send(session: Session, queue: JobQueue, id: string, data: object): Promise<void> {
    const sent = await this.sender.send(queue.name, data, {
      ...queue.sendOptions,
      id,
      db: sessionDb(session),
    });
    if (sent === null) {
      throw new TrellisError(
        'not_migrated',
        `the jobs queue ${queue.name} does not exist in ${this.options.jobsSchema}: run migrate()`,
      );
    }
  }

  /** Lets this process's worker look for jobs now (after a send committed). */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  private acquire = (): Promise<Session> => {
    if (!this.pool) return Promise.reject(new TrellisError('shutdown', 'no jobs pool'));
    return this.pool.acquire(10_000);
  };

  /** The worker: waits for the jobs schema, starts pg-boss, then works jobs until stopped. */
  private async run(): Promise<void> {
    const signal = this.controller.signal;
    let failures = 0;
    while (!signal.aborted) {
      try {
        if (!this.boss) {
          if (!(await this.schemaReady())) {
            await this.pause(INSTALL_RETRY_MS);
            continue;
          }
          const boss = this.newBoss(pooledDb(this.acquire), true);
          await boss.start();
          if (signal.aborted) {
            await boss.stop({ graceful: false, close: false });
            break;
          }
          this.boss = boss;
        }
        this.woken = false;
        await this.reclaim(this.boss);
        const worked = await this.workOne(this.boss);
        failures = 0;
        if (!worked && !this.woken) await this.pause(POLL_MS);
      } catch (error) {
        if (signal.aborted) break;
        failures += 1;
        const classified = classifyError(error, { doing: 'jobs' });
        this.log.warn(
          { code: classified.code, sqlstate: classified.sqlstate, failures },
          `jobs: ${classified.message}`,
        );
        await sleep(Math.min(30_000, 500 * 2 ** Math.min(failures, 6)), signal);
      }
    }
  }

  /** Whether the jobs schema is installed at the pg-boss version this code expects. */
  private async schemaReady(): Promise<boolean> {
    const session = await this.acquire();
    try {
      const [row] = await session.query<{ version: number | null }>(
        `SELECT CASE WHEN to_regclass($1) IS NOT NULL
                     THEN (SELECT version FROM ${this.options.jobsSchema}.version) END AS version`,
        [`${this.options.jobsSchema}.version`],
      );
      const version = row?.version ?? null;
      if (version !== BOSS_SCHEMA_VERSION) {
        // Said once at info, then at debug: it is looked at again every INSTALL_RETRY_MS.
        const say = this.waitAnnounced ? this.log.debug : this.log.info;
        this.waitAnnounced = true;
        say.call(
          this.log,
          { jobsSchema: this.options.jobsSchema, version, expected: BOSS_SCHEMA_VERSION },
          version === null
            ? 'self-checks wait for the jobs schema to be installed: run migrate() or the install SQL'
            : 'self-checks wait for the jobs schema to be at the version this trellis-pg expects: run migrate() or the install SQL of this version',
        );
        return false;
      }
      return true;
    } finally {
      await session.release();
    }
  }

  /**
   * Hands back to pg-boss, as failed attempts it retries, the jobs whose worker is gone
   * (killed, or stopped without its hand-back recorded), at most once per RECLAIM_MS.
   */
  private async reclaim(boss: PgBoss): Promise<void> {
    if (Date.now() - this.lastReclaim < RECLAIM_MS) return;
    this.lastReclaim = Date.now();
    for (const { queue, abandoned } of this.options.queues) {
      if (!abandoned) continue;
      const session = await this.acquire();
      try {
        const ids = await session.transaction(async () => {
          const found = await abandoned(session);
          for (const id of found) {
            await boss.fail(
              queue.name,
              id,
              { message: 'the worker running it is gone' },
              { db: sessionDb(session) },
            );
          }
          return found;
        });
        if (ids.length > 0) {
          this.log.info(
            { queue: queue.name, jobs: ids },
            `jobs: handed back ${ids.length} job(s) whose worker is gone, to be retried`,
          );
        }
      } finally {
        await session.release();
      }
    }
  }

  /** Takes one job of some queue, if any, and works it. */
  private async workOne(boss: PgBoss): Promise<boolean> {
    for (const { queue, handler } of this.options.queues) {
      const [job] = await boss.fetch<unknown>(queue.name, { batchSize: 1 });
      if (!job) continue;
      try {
        await handler(
          { id: job.id, data: job.data },
          { signal: this.controller.signal, acquire: this.acquire, log: this.log },
        );
      } catch (error) {
        const classified = classifyError(error, { doing: `job ${queue.name} ${job.id}` });
        if (!this.controller.signal.aborted) {
          this.log.warn(
            { queue: queue.name, job: job.id, code: classified.code },
            `${classified.message}: the job will be retried`,
          );
        }
        await this.record(() => boss.fail(queue.name, job.id, { message: classified.message }));
        return true;
      }
      await this.record(() => boss.complete(queue.name, job.id));
      return true;
    }
    return false;
  }

  /**
   * Records a job's outcome with pg-boss, within STOP_RECORD_MS once the handle is
   * stopping. A record that fails leaves the job active: pg-boss expires it, then retries.
   */
  private async record(write: () => Promise<unknown>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        write(),
        new Promise((_, reject) => {
          if (!this.controller.signal.aborted) return;
          timer = setTimeout(() => reject(new Error('shutting down')), STOP_RECORD_MS);
        }),
      ]);
    } catch (error) {
      const classified = classifyError(error, { doing: 'recording a job' });
      this.log.warn({ code: classified.code }, classified.message);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Sleeps `ms`, or until woken or stopped. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const signal = this.controller.signal;
      const finish = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', finish);
        this.wakeUp = undefined;
        resolve();
      };
      const timer = setTimeout(finish, ms);
      signal.addEventListener('abort', finish);
      this.wakeUp = finish;
      if (this.woken || signal.aborted) finish();
    });
  }

  /**
   * Stops the worker: a job in progress is stopped (its queries cancelled) and handed
   * back to pg-boss to retry, pg-boss stops, and the jobs pool closes.
   */
  async stop(): Promise<void> {
    this.controller.abort();
    await this.done;
    await this.boss?.stop({ graceful: false, close: false }).catch(() => undefined);
    await this.pool?.end(5);
  }
}
