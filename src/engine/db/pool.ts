import { TrellisError } from '../errors.js';
import type { CancelTarget } from './cancel-request.js';
import { classifyConnectError } from './classify.js';
import { createClient } from './client.js';
import type { ConnectionConfig } from './connection-config.js';
import { PooledClient } from './pooled-client.js';
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
 * How much longer than the driver's own connect timeout a connect may take before it is
 * given up on: the driver's timer is cancelled when a socket closes during startup, and a
 * server that keeps closing it cleanly would have it reconnect for ever (ADR 0007).
 */
const CONNECT_GRACE_MS = 1_000;

/**
 * A capped set of connections handing out `Session`s, each on a postgres.js client of its
 * own with one connection (max: 1). A client whose connection closed is never used again
 * (ADR 0007): the next session gets a fresh one. The cap is enforced here, with a deadline
 * for waiting, because postgres.js queues without one.
 */
export class ConnectionPool {
  private readonly permits: Semaphore;
  private readonly idle: PooledClient[] = [];
  private readonly clients = new Set<PooledClient>();
  private readonly cancelTarget: CancelTarget;
  private closed = false;

  constructor(
    readonly config: ConnectionConfig,
    private readonly options: PoolOptions,
  ) {
    this.permits = new Semaphore(options.max);
    this.cancelTarget = cancelTargetOf(config);
  }

  /** A client with one connection, retired when that connection closes. */
  private newClient(): PooledClient {
    const client: PooledClient = new PooledClient(
      createClient(this.config.url, {
        max: 1,
        onclose: () => client.markClosed(),
        ssl: this.config.ssl,
        connect_timeout: Math.max(1, Math.ceil(this.options.connectTimeoutMs / 1000)),
        idle_timeout: 60,
        connection: {
          application_name: this.options.applicationName,
          statement_timeout: this.options.statementTimeoutMs,
          // The engine's claims lock a row and then decide in a fresh statement, which
          // sees what committed before the lock only under READ COMMITTED (a database or
          // role set to another default would make them decide on stale rows, or fail).
          default_transaction_isolation: 'read committed',
          ...this.options.settings,
        },
      }),
      this.cancelTarget,
    );
    this.clients.add(client);
    return client;
  }

  /**
   * Opens the client's connection now, so a server that cannot be reached is reported as
   * such, and learns its backend key (for cancel requests). Gives up when the driver has
   * not answered by its own connect timeout and a little more.
   */
  private async connect(client: PooledClient): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const deadline = this.options.connectTimeoutMs + CONNECT_GRACE_MS;
    const result = await Promise.race([
      client.sql.unsafe('SELECT 1'),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(Object.assign(new Error('connect timed out'), { code: 'CONNECT_TIMEOUT' })),
          deadline,
        );
      }),
    ]).finally(() => clearTimeout(timer));
    client.backend = { pid: result.state.pid, secret: result.state.secret };
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
    while (client?.closed) {
      this.retire(client);
      client = this.idle.pop();
    }
    if (!client) {
      client = this.newClient();
      try {
        await this.connect(client);
      } catch (error) {
        this.retire(client, 0);
        this.permits.release();
        throw classifyConnectError(error, this.config);
      }
    }
    const acquired = client;
    return new Session(acquired, (broken) => {
      if (this.closed || broken || acquired.closed) {
        this.retire(acquired);
      } else {
        this.idle.push(acquired);
      }
      this.permits.release();
    });
  }

  /** Closes a client for good; queries still running after `timeoutSeconds` are dropped. */
  private retire(client: PooledClient, timeoutSeconds = 1): void {
    this.clients.delete(client);
    client.sql.end({ timeout: timeoutSeconds }).catch(() => undefined);
  }

  /** Sessions handed out now, the cap, and acquirers waiting for one (for metrics). */
  stats(): { inUse: number; max: number; waiting: number } {
    return {
      inUse: this.options.max - this.permits.free,
      max: this.options.max,
      waiting: this.permits.waiting,
    };
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
    await Promise.all(
      clients.map((client) => client.sql.end({ timeout: timeoutSeconds }).catch(() => undefined)),
    );
  }
}

/** Where cancel requests for this server go: the URL's first host, or its Unix socket. */
function cancelTargetOf(config: ConnectionConfig): CancelTarget {
  const url = new URL(config.url);
  const port = Number(url.port || 5432);
  const socketDir = url.searchParams.get('host') ?? (url.hostname === '' ? '/tmp' : undefined);
  if (socketDir?.startsWith('/')) return { path: `${socketDir}/.s.PGSQL.${port}` };
  return { host: url.hostname || 'localhost', port };
}
