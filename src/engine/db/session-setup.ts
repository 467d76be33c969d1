import { randomUUID } from 'node:crypto';
import type { Sql } from 'postgres';
import { TrellisError } from '../errors.js';
import type { ConnectionConfig } from './connection-config.js';

/**
 * What every engine connection goes through once opened, so that it works directly and
 * through a connection pooler in session mode alike (ADR 0037):
 *
 * - The engine's session settings (statement_timeout, default_transaction_isolation, the
 *   workers' work_mem…) are applied with `set_config` after the connection is open, never
 *   sent as startup parameters: PgBouncer refuses a startup parameter it does not know
 *   ("unsupported startup parameter"), and one the user tells it to ignore is dropped
 *   without a word. Only `application_name` (which PgBouncer passes on) is sent at startup.
 * - A pooler is recognised by the backend key it announces: PgBouncer (and the others)
 *   hands its clients keys of its own, so the pid in BackendKeyData is not the server's
 *   `pg_backend_pid()`. Directly connected, they are the same, and nothing more is done.
 * - Through a pooler, the first connection of each pool checks that the server session
 *   stays with the client between transactions (session pooling); a transaction or
 *   statement pooler hands it to other clients, which breaks session advisory locks (two
 *   elected workers), prepared statements and session settings. It is refused with
 *   `transaction_pooling`. Every connection through a pooler then checks that its settings
 *   stayed with it, in a transaction after the one that set them.
 */

/** The custom setting the checks leave in a session (a random token each time). */
const MARKER = 'trellis.session_check';

export interface ServerSession {
  /** The server's process for this connection (`pg_backend_pid()`). */
  serverPid: number;
  /** The client talks to Postgres through a connection pooler. */
  pooled: boolean;
  /** `user@host:port/database` of the URL, for messages. */
  description: string;
  /**
   * Why the session cannot write, when it cannot: its transactions are read-only
   * (`default_transaction_read_only` on for the database or role, or the server is a
   * standby). Found when the connection opens; the workers refuse to work on it, and it is
   * never handed out again (a fresh one is opened and checked), so the engine recovers on
   * its own once the server takes writes (ADR 0036).
   */
  readOnly: 'standby' | 'default_transaction_read_only' | null;
}

/** The error a worker fails with on a session that cannot write (ADR 0036). */
export function readOnlyError(
  description: string,
  why: 'standby' | 'default_transaction_read_only',
): TrellisError {
  const cause =
    why === 'standby'
      ? 'the server is a standby (in recovery): point Trellis at the primary'
      : 'default_transaction_read_only is on for the database or role (ALTER DATABASE … RESET default_transaction_read_only)';
  return new TrellisError(
    'read_only',
    `the session on ${description} is read-only: ${cause}; Trellis retries on new sessions until the server takes writes`,
    // The SQLSTATE a write on it would fail with (read_only_sql_transaction).
    { sqlstate: '25006' },
  );
}

/**
 * The error for a connection whose server session does not stay with it: the engine needs
 * a session of its own per connection (advisory locks elect its workers).
 */
export function transactionPoolingError(description: string, seen: string): TrellisError {
  return new TrellisError(
    'transaction_pooling',
    `${description} is a connection pooler in transaction (or statement) pooling mode (${seen}): Trellis needs a server session per connection, for the advisory locks that elect its workers, its prepared statements and its session settings. Connect Trellis to Postgres directly, or through a pool in session mode (PgBouncer: pool_mode = session for the database or user Trellis connects as)`,
  );
}

/** `pg_backend_pid()` of the session the next statement runs on, and the check's token. */
async function sessionIdentity(sql: Sql): Promise<{ pid: number; marker: string | null }> {
  const [row] = await sql.unsafe<Array<{ pid: number; marker: string | null }>>(
    `SELECT pg_backend_pid() AS pid, current_setting('${MARKER}', true) AS marker`,
  );
  return { pid: Number(row?.pid), marker: row?.marker ?? null };
}

/**
 * Whether a client through a pooler keeps one server session (session pooling), found by
 * experiment (ADR 0037). A second client that answers a statement and then fails to open a
 * transaction block is behind a statement pooler. Otherwise: `first` leaves a token in its session and ends its transaction;
 * a second client then opens a transaction and looks for the token; `first` looks again
 * once the second has ended its own. A transaction pooler hands an idle server session to
 * the next transaction of any client, and PgBouncer reuses the most recently released one
 * first, so one of the two lands on a session that is not (or no longer) `first`'s: the
 * second client sees the token, or `first` comes back to another pid or no token.
 */
async function keepsServerSession(
  first: Sql,
  openSecond: () => Sql,
  serverPid: number,
): Promise<{ kept: boolean; seen: string }> {
  const token = randomUUID();
  const [set] = await first.unsafe<Array<{ pid: number }>>(
    `SELECT pg_backend_pid() AS pid, set_config('${MARKER}', $1, false) IS NOT NULL AS set`,
    [token],
  );
  if (Number(set?.pid) !== serverPid) {
    return { kept: false, seen: 'a second statement ran on another server process' };
  }
  const second = openSecond();
  try {
    await second.unsafe('SELECT 1');
    // PgBouncer in statement pooling closes a client that opens a transaction block.
    const began = await second.unsafe('BEGIN').then(
      () => true,
      () => false,
    );
    if (!began) {
      return { kept: false, seen: 'the pooler refused a transaction block: statement pooling' };
    }
    const other = await sessionIdentity(second);
    await second.unsafe('ROLLBACK');
    if (other.marker === token || other.pid === serverPid) {
      return {
        kept: false,
        seen: "another client's transaction ran on this client's server session",
      };
    }
  } finally {
    await second.end({ timeout: 1 }).catch(() => undefined);
  }
  const again = await sessionIdentity(first);
  if (again.pid !== serverPid || again.marker !== token) {
    return { kept: false, seen: "this client's next transaction ran on another server session" };
  }
  return { kept: true, seen: '' };
}

export interface SetupOptions {
  /** Session settings (`set_config(name, value, false)`), statement_timeout included. */
  settings: Record<string, string>;
  /**
   * Check that a pooler keeps the server session with the client (the pool's first
   * connection through a pooler); `openSecond` opens another client like this one.
   */
  probe: (() => Sql) | undefined;
}

/**
 * Sets up a freshly opened connection (its first query is this): recognises a pooler,
 * refuses transaction pooling, applies the session settings and, through a pooler, checks
 * they stayed. `announcedPid` is the pid of the backend key the connection announced.
 */
export async function setUpSession(
  sql: Sql,
  config: ConnectionConfig,
  announcedPid: number,
  serverPid: number,
  options: SetupOptions,
): Promise<ServerSession> {
  const pooled = announcedPid !== serverPid;
  if (pooled && options.probe) {
    const { kept, seen } = await keepsServerSession(sql, options.probe, serverPid);
    if (!kept) throw transactionPoolingError(config.description, seen);
  }
  const names = Object.keys(options.settings);
  const values = names.map((n) => options.settings[n]!);
  const token = pooled ? randomUUID() : '';
  // In the same statement: whether the session can write (a database whose default is
  // read-only, or a standby after a failover, opens sessions that cannot).
  const [state] = await sql.unsafe<Array<{ read_only: string; standby: boolean }>>(
    `SELECT count(set_config(s.name, s.value, false)) AS n,
            current_setting('transaction_read_only') AS read_only, pg_is_in_recovery() AS standby
       FROM unnest($1::text[], $2::text[]) AS s(name, value)`,
    [pooled ? [...names, MARKER] : names, pooled ? [...values, token] : values] as never[],
  );
  const readOnly = state?.standby
    ? 'standby'
    : state?.read_only === 'on'
      ? 'default_transaction_read_only'
      : null;
  if (pooled) {
    const after = await sessionIdentity(sql);
    if (after.pid !== serverPid || after.marker !== token) {
      throw transactionPoolingError(
        config.description,
        'the session settings were not there in the next transaction',
      );
    }
  }
  return { serverPid, pooled, description: config.description, readOnly };
}
