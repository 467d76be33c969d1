import { classifyError } from '../db/classify.js';
import type { ConnectionPool } from '../db/pool.js';
import type { Session } from '../db/session.js';
import { readOnlyError, transactionPoolingError } from '../db/session-setup.js';
import type { Logger } from '../logger.js';
import type { LoopError, LoopHealth } from './health.js';
import { sleep } from './sleep.js';

export interface WorkerLoopOptions {
  /** Names the loop in log lines. */
  name: string;
  pool: ConnectionPool;
  log: Logger;
  signal: AbortSignal;
  /** Runs on every new session before the first step (to take session-level locks). */
  onSession?: (session: Session) => Promise<void>;
  /** One unit of work; resolves to how long to wait before the next (0: at once). */
  step: (session: Session) => Promise<number>;
}

const MAX_BACKOFF_MS = 5_000;

/** How often a loop checks its connection is still the one it took its locks on. */
const SESSION_CHECK_MS = 1_000;

/**
 * A background loop on a session of its own (staging worker, drain loops). A failed step
 * is logged and retried after a growing pause; a session lost to a connection error is
 * replaced. Stops when `signal` aborts; `current()` lets shutdown cancel the query in
 * flight.
 */
export class WorkerLoop {
  private session: Session | undefined;
  private backendPid: number | undefined;
  private nextSessionCheck = 0;
  private lastPassAt: Date | undefined;
  private failingSince: Date | undefined;
  private failures = 0;
  private lastError: LoopError | undefined;
  readonly done: Promise<void>;

  constructor(private readonly options: WorkerLoopOptions) {
    this.done = this.run();
  }

  /**
   * The loop has a session and has run `onSession` on its backend (its locks are taken):
   * it is alive as far as Postgres can tell (metrics: drain loops alive, staging leader).
   */
  get connected(): boolean {
    return this.session !== undefined && !this.session.aborted && this.backendPid !== undefined;
  }

  /** How the loop fares: its last completed step, and its failures since (ADR 0038). */
  health(): LoopHealth {
    return {
      backendPid: this.connected ? (this.backendPid ?? null) : null,
      connected: this.connected,
      lastPassAt: this.lastPassAt?.toISOString() ?? null,
      failingSince: this.failingSince?.toISOString() ?? null,
      failures: this.failures,
      lastError: this.lastError ?? null,
    };
  }

  /**
   * A step that runs long (the WAL decoder streams in one) says here that it is getting on:
   * a pass, as far as its health goes (ADR 0038).
   */
  progressed(): void {
    this.lastPassAt = new Date();
    this.failures = 0;
    this.failingSince = undefined;
  }

  /** Cancels the query in flight, if any (shutdown). */
  interrupt(): void {
    this.session?.abort('shutdown', `${this.options.name} stopped by shutdown`);
  }

  private async run(): Promise<void> {
    const { signal, log, name } = this.options;
    while (!signal.aborted) {
      try {
        if (!this.session) {
          this.session = await this.options.pool.acquire(10_000);
          this.backendPid = undefined;
        }
        await this.checkSession(this.session);
        const wait = await this.options.step(this.session);
        this.progressed();
        if (wait > 0) await sleep(wait, signal);
      } catch (error) {
        if (signal.aborted) break;
        const failures = ++this.failures;
        const classified = classifyError(error, { doing: name });
        const at = new Date();
        this.failingSince ??= at;
        this.lastError = {
          message: classified.message,
          code: classified.code,
          sqlstate: classified.sqlstate ?? null,
          at: at.toISOString(),
        };
        log.warn(
          {
            loop: name,
            code: classified.code,
            sqlstate: classified.sqlstate,
            failures,
            error: classified.message,
          },
          `${name}: ${classified.message}`,
        );
        // A connection error of another connection (the WAL decoder's replication stream)
        // leaves the loop's own session, and so its election, in place.
        if (
          this.session?.lost ||
          this.session?.aborted ||
          classified.code === 'transaction_pooling' ||
          classified.code === 'read_only'
        ) {
          await this.dropSession();
        }
        await sleep(Math.min(MAX_BACKOFF_MS, 100 * 2 ** Math.min(failures, 6)), signal);
      }
    }
    await this.dropSession();
  }

  /**
   * The driver reconnects a lost connection by itself on the next query: session-level
   * state (advisory locks) is then gone. Seeing a new backend pid, run onSession again.
   * Through a connection pooler, a new pid on the same connection means the pooler moved
   * the connection to another server session (transaction pooling, which connect() did
   * not catch or the pooler was reconfigured to since): the locks that elect workers do
   * not hold there, so the loop stops working and says why (ADR 0037).
   */
  private async checkSession(session: Session): Promise<void> {
    // A session that cannot write is refused before any lock is taken (ADR 0036): the
    // loop fails, says why in its health, and tries a fresh session after its backoff.
    const server = session.server;
    if (server?.readOnly) throw readOnlyError(server.description, server.readOnly);
    const now = Date.now();
    if (this.backendPid !== undefined && now < this.nextSessionCheck) return;
    this.nextSessionCheck = now + SESSION_CHECK_MS;
    const [row] = await session.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    if (server?.pooled && row?.pid !== server.serverPid) {
      throw transactionPoolingError(
        server.description,
        `${this.options.name}'s connection moved from server process ${server.serverPid} to ${row?.pid}`,
      );
    }
    if (row?.pid !== this.backendPid) {
      this.backendPid = row?.pid;
      await this.options.onSession?.(session);
    }
  }

  private async dropSession(): Promise<void> {
    const session = this.session;
    this.session = undefined;
    if (session) await session.release().catch(() => undefined);
  }
}
