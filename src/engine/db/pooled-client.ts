import type { Sql } from 'postgres';
import { type BackendKey, type CancelTarget, sendCancelRequest } from './cancel-request.js';
import type { ServerSession } from './session-setup.js';

/**
 * A postgres.js client with one connection, and whether that connection has closed.
 *
 * The driver does not settle every query whose connection dies (ADR 0007): a query sent
 * between the socket's 'error' and 'close' events is queued and never rejected, and a
 * connect whose socket closes cleanly can reconnect for ever. So the pool watches the
 * close itself (`onclose`), and a session's query in flight is given up on once it fires.
 */
export class PooledClient {
  private closedFlag = false;
  private readonly listeners = new Set<() => void>();
  /** The backend of the one connection, once connected (for cancel requests). */
  backend: BackendKey | undefined;
  /** The server session behind it, once set up: its pid, and whether a pooler is between. */
  server: ServerSession | undefined;
  /** The cancel request in flight, if any: the connection is closed only once it is done. */
  private cancelling: Promise<void> | undefined;

  constructor(
    readonly sql: Sql,
    private readonly cancelTarget: CancelTarget,
  ) {}

  get closed(): boolean {
    return this.closedFlag;
  }

  /** Called from the driver's `onclose`: the client is never used again. */
  markClosed(): void {
    if (this.closedFlag) return;
    this.closedFlag = true;
    for (const listener of this.listeners) listener();
    this.listeners.clear();
  }

  /** Runs `listener` when the connection closes (at once if it has); returns an unsubscribe. */
  onClose(listener: () => void): () => void {
    if (this.closedFlag) {
      listener();
      return () => undefined;
    }
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Asks the server to cancel whatever this connection runs now; never fails. */
  cancel(): Promise<void> {
    if (!this.backend || this.closedFlag) return Promise.resolve();
    this.cancelling ??= sendCancelRequest(this.cancelTarget, this.backend);
    return this.cancelling;
  }

  /**
   * Resolves once no cancel request of this connection is in flight (at once when none
   * was sent). A connection is closed only after its cancel was handled: through a pooler,
   * the server session goes back to the pool when the client leaves, and a cancel still on
   * its way could reach another client's statement there; and PgBouncer 1.18 crashes when
   * a client leaves while the cancel it asked for is being forwarded (ADR 0037).
   */
  cancelled(): Promise<void> {
    return this.cancelling ?? Promise.resolve();
  }
}
