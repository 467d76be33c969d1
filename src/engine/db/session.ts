import type { Sql } from 'postgres';
import { TrellisError, type TrellisErrorCode } from '../errors.js';

export type Row = Record<string, unknown>;
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

  constructor(
    private readonly conn: Sql,
    private readonly onRelease: () => void = () => undefined,
  ) {}

  get aborted(): TrellisError | undefined {
    return this.abortedWith;
  }

  async query<T extends object = Row>(text: string, params: Params = []): Promise<T[]> {
    if (this.abortedWith) throw this.abortedWith;
    // postgres.js' "unsafe" means "not a tagged template": parameters are still bound.
    const pending = this.conn.unsafe(text, params as never[], { prepare: true });
    this.current = pending;
    try {
      const rows = await pending;
      return rows as unknown as T[];
    } catch (error) {
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

  private async rollbackQuietly(): Promise<void> {
    try {
      const pending = this.conn.unsafe('ROLLBACK');
      await pending;
    } catch {
      // The connection may be gone; postgres.js reconnects on next use.
    }
  }

  /** Returns the connection to the pool, rolling back anything left open. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    if (this.inTransaction || this.abortedWith) await this.rollbackQuietly();
    this.onRelease();
  }
}
