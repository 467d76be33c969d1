import type postgres from 'postgres';
import { TrellisError } from '../errors.js';
import type { CancelTarget } from './cancel-request.js';
import { classifyConnectError } from './classify.js';
import { createClient } from './client.js';
import type { ConnectionConfig } from './connection-config.js';
import { PooledClient } from './pooled-client.js';
import { Semaphore } from './semaphore.js';
import { Session } from './session.js';
import { setUpSession } from './session-setup.js';

export interface PoolOptions {
  max: number;
  applicationName: string;
  /** Server-side safety net: no statement of this pool runs longer than this. */
  statementTimeoutMs: number;
  connectTimeoutMs: number;
  /** Extra session settings, applied when a connection opens (e.g. the workers' work_mem). */
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
  /**
   * Set once a connection through a pooler was found to keep its server session (session
   * pooling): later connections of this pool skip that experiment (ADR 0037).
   */
  private sessionPoolingSeen = false;
  /** Clients being closed (retire): `end()` waits for them too. */
  private readonly retiring = new Set<Promise<unknown>>();

  constructor(
    readonly config: ConnectionConfig,
    private readonly options: PoolOptions,
  ) {
    this.permits = new Semaphore(options.max);
    this.cancelTarget = cancelTargetOf(config);
  }

  /**
   * A postgres.js client with one connection. Only `application_name` goes in the startup
   * message: a connection pooler refuses startup parameters it does not know (the session
   * settings are applied once the connection is open, see session-setup.ts).
   */
  private openClient(onclose?: () => void): postgres.Sql {
    return createClient(this.config.url, {
      max: 1,
      ...(onclose ? { onclose } : {}),
      ssl: this.config.ssl,
      connect_timeout: Math.max(1, Math.ceil(this.options.connectTimeoutMs / 1000)),
      idle_timeout: 60,
      connection: { application_name: this.options.applicationName },
    });
  }

  /** A client with one connection, retired when that connection closes. */
  private newClient(): PooledClient {
    const client: PooledClient = new PooledClient(
      this.openClient(() => client.markClosed()),
      this.cancelTarget,
    );
    this.clients.add(client);
    return client;
  }

  /** The session settings every connection of this pool runs with. */
  private sessionSettings(): Record<string, string> {
    return {
      statement_timeout: String(this.options.statementTimeoutMs),
      // The engine's claims lock a row and then decide in a fresh statement, which sees
      // what committed before the lock only under READ COMMITTED (a database or role set
      // to another default would make them decide on stale rows, or fail).
      default_transaction_isolation: 'read committed',
      ...this.options.settings,
    };
  }

  /**
   * Opens the client's connection now, so a server that cannot be reached is reported as
   * such, learns its backend key (for cancel requests), and sets its session up (settings;
   * through a pooler, refuses transaction pooling). Gives up when the driver has not
   * answered by its own connect timeout and a little more.
   */
  private async connect(client: PooledClient): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const deadline = this.options.connectTimeoutMs + CONNECT_GRACE_MS;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(Object.assign(new Error('connect timed out'), { code: 'CONNECT_TIMEOUT' })),
        deadline,
      );
    });
    try {
      const result = await Promise.race([
        client.sql.unsafe<Array<{ pid: number }>>('SELECT pg_backend_pid() AS pid'),
        timedOut,
      ]);
      client.backend = { pid: result.state.pid, secret: result.state.secret };
      const probe = this.sessionPoolingSeen ? undefined : () => this.openClient();
      client.server = await Promise.race([
        setUpSession(client.sql, this.config, result.state.pid, Number(result[0]?.pid), {
          settings: this.sessionSettings(),
          probe,
        }),
        timedOut,
      ]);
      if (client.server.pooled) this.sessionPoolingSeen = true;
    } finally {
      clearTimeout(timer);
    }
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

  /**
   * Closes a client for good, once a cancel request it sent was handled (pooled-client.ts);
   * queries still running after `timeoutSeconds` are dropped.
   */
  private retire(client: PooledClient, timeoutSeconds = 1): void {
    this.clients.delete(client);
    const closing = client
      .cancelled()
      .then(() => client.sql.end({ timeout: timeoutSeconds }))
      .catch(() => undefined)
      .finally(() => this.retiring.delete(closing));
    this.retiring.add(closing);
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
    await Promise.all([
      ...clients.map((client) =>
        client
          .cancelled()
          .then(() => client.sql.end({ timeout: timeoutSeconds }))
          .catch(() => undefined),
      ),
      ...this.retiring,
    ]);
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
