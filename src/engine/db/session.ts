import type { Sql } from 'postgres';
import { TrellisError, type TrellisErrorCode } from '../errors.js';

export type Row = Record<string, unknown>;

/** How long a ROLLBACK after a failure may take before the connection is given up. */
const ROLLBACK_WAIT_MS = 5_000;
export type Params = readonly unknown[];

/** Why a session's work was stopped from outside. */
export type AbortReason = Extract<TrellisErrorCode, 'timeout' | 'shutdown'>;

/**
 * One Postgres connection held by one call or worker. Every query goes through `query`,
 * so the one in flight can be cancelled on the server (timeout, shutdown), after which
 * the session refuses further queries and the holder unwinds.
 */
export class Session {
  private current: { cancel(): unknown } | undefined;
  private abortedWith: TrellisError | undefined;
  private inTransaction = false;
  private released = false;
  /** The connection was lost: the client is discarded, never reused (see isConnectionLoss). */
  private broken = false;

  constructor(
    private readonly conn: Sql,
    private readonly onRelease: (broken: boolean) => void = () => undefined,
    private readonly connectionClosed: () => boolean = () => false,
  ) {}

  get aborted(): TrellisError | undefined {
    return this.abortedWith;
  }

  async query<T extends object = Row>(text: string, params: Params = []): Promise<T[]> {
    if (this.abortedWith) throw this.abortedWith;
    if (this.connectionClosed()) {
      this.broken = true;
      throw new TrellisError('connection', 'the connection to Postgres was closed');
    }
    // postgres.js' "unsafe" means "not a tagged template": parameters are still bound.
    const pending = this.conn.unsafe(text, params as never[], { prepare: true });
    this.current = pending;
    try {
      const rows = await pending;
      return rows as unknown as T[];
    } catch (error) {
      if (isConnectionLoss(error)) this.broken = true;
      throw this.abortedWith ?? error;
    } finally {
      if (this.current === pending) this.current = undefined;
    }
  }

  /** Runs `fn` in a transaction; commits when it resolves, rolls back when it throws. */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    if (this.inTransaction) return fn();
    await this.query('BEGIN');
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

  /** Stops the work: cancels the query in flight on the server; later queries throw. */
  abort(code: AbortReason, message: string): void {
    if (this.abortedWith) return;
    this.abortedWith = new TrellisError(code, message);
    this.current?.cancel();
  }

  /**
   * Ends an open transaction after a failure. Not on a lost connection (the server has
   * rolled back already, and a query on a client whose connection closed can wait for
   * ever); and never for long: a ROLLBACK that does not answer marks the session broken.
   */
  private async rollbackQuietly(): Promise<void> {
    if (this.broken || this.connectionClosed()) {
      this.broken = true;
      return;
    }
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        this.conn.unsafe('ROLLBACK'),
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

  /** Returns the connection to the pool, rolling back anything left open. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
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
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return true;
  if (!/^[0-9A-Z]{5}$/.test(code)) return true;
  return code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03';
}
