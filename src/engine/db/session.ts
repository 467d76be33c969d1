import { TrellisError, type TrellisErrorCode } from '../errors.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';
import type { PooledClient } from './pooled-client.js';
import type { ServerSession } from './session-setup.js';

export type Row = Record<string, unknown>;
export type Params = readonly unknown[];

/** Why a session's work was stopped from outside. */
export type AbortReason = Extract<TrellisErrorCode, 'timeout' | 'shutdown'>;

/**
 * How long a query may stay unsettled once its connection has closed. The driver rejects
 * such a query itself when it can, synchronously inside its close handler, so anything
 * still pending after this pause never will be.
 */
const CLOSED_GRACE_MS = 100;
/** How long a cancelled query may take to come back before it is given up on. */
const CANCEL_GRACE_MS = 2_000;
/** How long a ROLLBACK after a failure may take before the connection is given up. */
const ROLLBACK_WAIT_MS = 5_000;

/**
 * One Postgres connection held by one call or worker. Every query goes through `query`,
 * so the one in flight can be cancelled on the server (timeout, shutdown), after which
 * the session refuses further queries and the holder unwinds.
 *
 * Every query settles, whatever the driver does: once the connection is lost (an error
 * that says so, or the connection's close), the session sends nothing more and is
 * discarded on release; a query still pending when its connection closed, or that does
 * not come back after a cancel, is given up on (ADR 0007).
 */
export class Session {
  /** The query in flight, if any. */
  private current: Promise<unknown> | undefined;
  /** Rejects the query in flight from outside the driver (see `settle`). */
  private giveUp: ((error: Error) => void) | undefined;
  private abortedWith: TrellisError | undefined;
  private inTransaction = false;
  private released = false;
  /** The connection was lost: nothing more is sent, and the client is discarded. */
  private broken = false;
  /**
   * A cancel request went out for this connection. It travels on a connection of its own
   * and can arrive after the query it was meant for has ended, cancelling whatever the
   * backend runs next: the connection is discarded, never handed to another holder.
   */
  private cancelSent = false;
  /**
   * A statement failed because the session is read-only (25006): a database whose default
   * became read-only, or a failover onto a standby. The connection is discarded on
   * release, never reused: the next one is opened afresh and checked (ADR 0036).
   */
  private readOnlyHit = false;

  constructor(
    private readonly client: PooledClient,
    private readonly onRelease: (broken: boolean) => void = () => undefined,
  ) {}

  get aborted(): TrellisError | undefined {
    return this.abortedWith;
  }

  /** Its connection is lost (nothing more is sent on it): it must be replaced. */
  get lost(): boolean {
    return this.broken || this.client.closed;
  }

  /** The server session behind the connection: its pid, and whether a pooler is between. */
  get server(): ServerSession | undefined {
    return this.client.server;
  }

  async query<T extends object = Row>(text: string, params: Params = []): Promise<T[]> {
    if (this.abortedWith) throw this.abortedWith;
    if (this.broken || this.client.closed) {
      this.broken = true;
      throw new TrellisError('connection', 'the connection to Postgres was closed');
    }
    // postgres.js' "unsafe" means "not a tagged template": parameters are still bound.
    return this.run<T>(this.client.sql.unsafe(text, params as never[], { prepare: true }));
  }

  /**
   * Runs `text`, which may hold several statements and takes no parameters, by the simple
   * query protocol (as psql does). Resolves to the last statement's rows when it is one
   * statement; to one array of rows per statement when it is several.
   */
  async simpleQuery<T extends object = Row>(text: string): Promise<T[] | T[][]> {
    if (this.abortedWith) throw this.abortedWith;
    if (this.broken || this.client.closed) {
      this.broken = true;
      throw new TrellisError('connection', 'the connection to Postgres was closed');
    }
    return this.run<T>(this.client.sql.unsafe(text).simple());
  }

  private async run<T>(pending: Promise<unknown>): Promise<T[]> {
    this.current = pending;
    try {
      const rows = await this.settle(pending);
      return rows as unknown as T[];
    } catch (error) {
      if (isConnectionLoss(error)) this.broken = true;
      if (sqlstateOf(error) === SQLSTATE.readOnlySqlTransaction) this.readOnlyHit = true;
      throw this.abortedWith ?? error;
    } finally {
      if (this.current === pending) this.current = undefined;
    }
  }

  /**
   * `pending`, or a `connection` error once the connection has closed under it without the
   * driver settling it (or `giveUp` is called by `abort`).
   */
  private async settle<T>(pending: Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const stuck = new Promise<never>((_, reject) => {
      this.giveUp = (error) => {
        this.broken = true;
        reject(error);
      };
    });
    const unsubscribe = this.client.onClose(() => {
      timer = setTimeout(
        () =>
          this.giveUp?.(
            new TrellisError('connection', 'the connection to Postgres closed during a query'),
          ),
        CLOSED_GRACE_MS,
      );
    });
    try {
      return await Promise.race([pending, stuck]);
    } finally {
      unsubscribe();
      clearTimeout(timer);
      this.giveUp = undefined;
    }
  }

  /**
   * Runs `fn` in a transaction; commits when it resolves, rolls back when it throws.
   * `begin` opens it (e.g. `BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY`).
   */
  async transaction<T>(fn: () => Promise<T>, begin = 'BEGIN'): Promise<T> {
    if (this.inTransaction) return fn();
    await this.query(begin);
    this.inTransaction = true;
    try {
      const result = await fn();
      await this.query('COMMIT');
      return result;
    } catch (error) {
      await this.rollbackQuietly();
      throw error;
    } finally {
      this.inTransaction = false;
    }
  }

  /**
   * Stops the work: cancels the query in flight on the server; later queries throw. A
   * query that does not come back soon after the cancel (the connection may be gone
   * without the driver noticing) is given up on, and the connection with it.
   */
  abort(code: AbortReason, message: string): void {
    if (this.abortedWith) return;
    const error = new TrellisError(code, message);
    this.abortedWith = error;
    if (!this.current) return;
    this.cancelSent = true;
    void this.client.cancel();
    const giveUp = this.giveUp;
    setTimeout(() => giveUp?.(error), CANCEL_GRACE_MS).unref();
  }

  /**
   * Ends an open transaction after a failure. Not on a lost connection (the server has
   * rolled back already); and never for long: a ROLLBACK that does not answer marks the
   * session broken.
   */
  private async rollbackQuietly(): Promise<void> {
    if (this.broken || this.client.closed) {
      this.broken = true;
      return;
    }
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        this.settle(this.client.sql.unsafe('ROLLBACK')),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error('ROLLBACK did not answer')), ROLLBACK_WAIT_MS);
        }),
      ]);
    } catch {
      this.broken = true;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Returns the connection to the pool, rolling back anything left open; `discard` closes
   * it instead (it holds session state, such as an advisory lock, no other holder may get).
   */
  async release(discard = false): Promise<void> {
    if (this.released) return;
    this.released = true;
    // A read-only session (found when it opened, or by a write it refused) is closed: its
    // connection would stay read-only after the server takes writes again.
    if (discard || this.cancelSent || this.readOnlyHit || this.client.server?.readOnly) {
      this.onRelease(true);
      return;
    }
    if (this.inTransaction || this.abortedWith) await this.rollbackQuietly();
    this.onRelease(this.broken);
  }
}

/**
 * Errors that mean the connection itself is gone: the driver's own codes (it puts them
 * where a SQLSTATE would be), network errors, and the server ending the session. A
 * postgres.js client is not reused after one: reusing it can leave a later query
 * waiting forever.
 */
export function isConnectionLoss(error: unknown): boolean {
  if (error instanceof TrellisError) return error.code === 'connection';
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return true;
  if (!/^[0-9A-Z]{5}$/.test(code)) return true;
  return code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03';
}
