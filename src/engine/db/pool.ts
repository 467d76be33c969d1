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
 * A capped set of connections handing out `Session`s, each on a postgres.js client of its
 * own with one connection (max: 1). A client whose connection died reconnects on its next
 * query by itself; a shared postgres.js pool's reserved connection, by contrast, cannot be
 * used again once the server has closed it. The cap is enforced here, with a deadline for
 * waiting, because postgres.js queues without one.
 */
export class ConnectionPool {
  private readonly permits: Semaphore;
  private readonly idle: Sql[] = [];
  private readonly clients = new Set<Sql>();
  /** Clients whose connection closed: never used again (see createClient). */
  private readonly dead = new WeakSet<Sql>();
  private closed = false;

  constructor(
    readonly config: ConnectionConfig,
    private readonly options: PoolOptions,
  ) {
    this.permits = new Semaphore(options.max);
  }

  /**
   * A client with one connection. When that connection closes (server restart, a
   * terminated backend, the idle timeout) the client is retired: postgres.js would
   * reconnect it on the next query, but its reconnect path can lose the startup message
   * and leave that query waiting until the connect timeout, so a fresh client is used.
   */
  private createClient(): Sql {
    const client: Sql = postgres(this.config.url, {
      max: 1,
      onclose: () => {
        this.dead.add(client);
      },
      ssl: this.config.ssl,
      onnotice: () => undefined,
      connect_timeout: Math.max(1, Math.ceil(this.options.connectTimeoutMs / 1000)),
      idle_timeout: 60,
      connection: {
        application_name: this.options.applicationName,
        statement_timeout: this.options.statementTimeoutMs,
        ...this.options.settings,
      },
    });
    this.clients.add(client);
    return client;
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
    let client = this.idle.pop();
    while (client && this.dead.has(client)) {
      this.retire(client);
      client = this.idle.pop();
    }
    try {
      if (!client) {
        client = this.createClient();
        // Connect now, so a server that cannot be reached is reported as such.
        await client.unsafe('SELECT 1');
      }
    } catch (error) {
      if (client) {
        this.clients.delete(client);
        void client.end({ timeout: 0 });
      }
      this.permits.release();
      throw classifyConnectError(error, this.config);
    }
    const acquired = client;
    return new Session(
      acquired,
      (broken) => {
        if (this.closed || broken || this.dead.has(acquired)) {
          this.retire(acquired);
        } else {
          this.idle.push(acquired);
        }
        this.permits.release();
      },
      () => this.dead.has(acquired),
    );
  }

  private retire(client: Sql): void {
    this.clients.delete(client);
    void client.end({ timeout: 1 });
  }

  /** Refuses new sessions from now on, and turns away those waiting for one. */
  refuseNew(): void {
    this.closed = true;
    this.permits.refuseWaiters();
  }

  /** Closes every connection; queries still running after `timeoutSeconds` are dropped. */
  async end(timeoutSeconds = 5): Promise<void> {
    this.refuseNew();
    const clients = [...this.clients];
    this.clients.clear();
    this.idle.length = 0;
    await Promise.all(clients.map((client) => client.end({ timeout: timeoutSeconds })));
  }
}
