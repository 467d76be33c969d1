import postgres, { type Sql } from 'postgres';
import { TrellisError } from '../errors.js';
import { classifyConnectError } from './classify.js';
import type { ConnectionConfig } from './connection-config.js';
import { Semaphore } from './semaphore.js';
import { Session } from './session.js';

export interface PoolOptions {
  max: number;
  applicationName: string;
  /** Server-side safety net: no statement of this pool runs longer than this. */
  statementTimeoutMs: number;
  connectTimeoutMs: number;
  /** Extra session settings sent at connect time (e.g. plan_cache_mode for the drain). */
  settings?: Record<string, string>;
}

/**
 * A capped set of connections (postgres.js underneath) handing out `Session`s. The cap is
 * enforced here, with a deadline for waiting, because postgres.js queues without one.
 */
export class ConnectionPool {
  readonly sql: Sql;
  private readonly permits: Semaphore;
  private closed = false;

  constructor(
    readonly config: ConnectionConfig,
    options: PoolOptions,
  ) {
    this.permits = new Semaphore(options.max);
    this.sql = postgres(config.url, {
      max: options.max,
      ssl: config.ssl,
      onnotice: () => undefined,
      connect_timeout: Math.max(1, Math.ceil(options.connectTimeoutMs / 1000)),
      idle_timeout: 60,
      connection: {
        application_name: options.applicationName,
        statement_timeout: options.statementTimeoutMs,
        ...options.settings,
      },
    });
  }

  /**
   * A session, or a `timeout` error when no connection was free within `waitMs`, or a
   * `connection` error saying what to fix when Postgres cannot be reached.
   */
  async acquire(waitMs: number): Promise<Session> {
    if (this.closed) throw new TrellisError('shutdown', 'the handle is shut down');
    if (!(await this.permits.acquire(waitMs))) {
      if (this.closed) throw new TrellisError('shutdown', 'the handle is shut down');
      throw new TrellisError(
        'timeout',
        `no pooled connection came free within ${waitMs} ms (pool.max is reached)`,
      );
    }
    try {
      const reserved = await this.sql.reserve();
      return new Session(reserved, () => this.permits.release());
    } catch (error) {
      this.permits.release();
      throw classifyConnectError(error, this.config);
    }
  }

  /** Refuses new sessions from now on, and turns away those waiting for one. */
  refuseNew(): void {
    this.closed = true;
    this.permits.refuseWaiters();
  }

  /** Closes every connection; queries still running after `timeoutSeconds` are dropped. */
  async end(timeoutSeconds = 5): Promise<void> {
    this.refuseNew();
    await this.sql.end({ timeout: timeoutSeconds });
  }
}
