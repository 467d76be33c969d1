import { connect, type Socket } from 'node:net';

/** The backend a connection talks to, as the server announced it (BackendKeyData). */
export interface BackendKey {
  pid: number;
  secret: number;
}

/** Where a cancel request goes: a TCP host and port, or a Unix socket path. */
export type CancelTarget = { path: string } | { host: string; port: number };

/** How long a cancel request is waited for before its caller moves on. */
const CANCEL_REQUEST_TIMEOUT_MS = 5_000;
/**
 * How long its socket is then left for the server to close, before it is closed from
 * here: PgBouncer gives up on a cancel after `cancel_wait_timeout` (10 s by default).
 */
const CANCEL_SOCKET_LIFETIME_MS = 60_000;

/**
 * Asks the server to cancel what `backend` is running, as libpq's PQcancel does: a
 * CancelRequest message on a fresh connection, which the server closes without a reply
 * once it has handled it. Resolves then (the cancel has reached the backend), or after
 * CANCEL_REQUEST_TIMEOUT_MS.
 *
 * The socket is never closed from this side first while the server may still be handling
 * the request: PgBouncer 1.18 (Debian 12's) exits with "bad client state" when the client
 * of a cancel request leaves before the cancel it forwards is done (pgbouncer#801, fixed
 * in 1.20), dropping every client of the pooler, the app's included (ADR 0037). A request
 * not handled in time is left to the server to close, and closed from here only after
 * CANCEL_SOCKET_LIFETIME_MS.
 *
 * Not the driver's `query.cancel()`: postgres.js discards the promise its cancel
 * connection settles, so a cancel that cannot connect (the server is restarting, say)
 * escapes as an unhandled rejection (ADR 0007). This one never rejects and never throws:
 * a cancel that fails leaves the query to the session's own give-up deadline.
 */
export function sendCancelRequest(target: CancelTarget, backend: BackendKey): Promise<void> {
  return new Promise((resolve) => {
    let socket: Socket;
    let lifetime: NodeJS.Timeout | undefined;
    const done = () => {
      clearTimeout(timer);
      clearTimeout(lifetime);
      socket?.destroy();
      resolve();
    };
    // Waited for long enough: the caller moves on, the server may still close the socket.
    const timer = setTimeout(() => {
      resolve();
      socket?.unref();
      lifetime = setTimeout(done, CANCEL_SOCKET_LIFETIME_MS);
      lifetime.unref();
    }, CANCEL_REQUEST_TIMEOUT_MS);
    timer.unref();
    try {
      socket = 'path' in target ? connect(target.path) : connect(target.port, target.host);
    } catch {
      done();
      return;
    }
    socket.on('error', done);
    socket.on('close', done);
    // The server closes the connection once it has handled the request.
    socket.on('end', done);
    socket.on('connect', () => {
      const message = Buffer.alloc(16);
      message.writeInt32BE(16, 0);
      message.writeInt32BE(80877102, 4);
      message.writeUInt32BE(backend.pid >>> 0, 8);
      message.writeUInt32BE(backend.secret >>> 0, 12);
      socket.write(message);
    });
  });
}
