import { connect, type Socket } from 'node:net';

/** The backend a connection talks to, as the server announced it (BackendKeyData). */
export interface BackendKey {
  pid: number;
  secret: number;
}

/** Where a cancel request goes: a TCP host and port, or a Unix socket path. */
export type CancelTarget = { path: string } | { host: string; port: number };

/** How long a cancel request may take before it is abandoned. */
const CANCEL_REQUEST_TIMEOUT_MS = 5_000;

/**
 * Asks the server to cancel what `backend` is running, as libpq's PQcancel does: a
 * CancelRequest message on a fresh connection, which the server closes without a reply.
 *
 * Not the driver's `query.cancel()`: postgres.js discards the promise its cancel
 * connection settles, so a cancel that cannot connect (the server is restarting, say)
 * escapes as an unhandled rejection (ADR 0007). This one never rejects and never throws:
 * a cancel that fails leaves the query to the session's own give-up deadline.
 */
export function sendCancelRequest(target: CancelTarget, backend: BackendKey): Promise<void> {
  return new Promise((resolve) => {
    let socket: Socket;
    const done = () => {
      clearTimeout(timer);
      socket?.destroy();
      resolve();
    };
    const timer = setTimeout(done, CANCEL_REQUEST_TIMEOUT_MS);
    timer.unref();
    try {
      socket = 'path' in target ? connect(target.path) : connect(target.port, target.host);
    } catch {
      done();
      return;
    }
    socket.on('error', done);
    socket.on('close', done);
    socket.on('connect', () => {
      const message = Buffer.alloc(16);
      message.writeInt32BE(16, 0);
      message.writeInt32BE(80877102, 4);
      message.writeUInt32BE(backend.pid >>> 0, 8);
      message.writeUInt32BE(backend.secret >>> 0, 12);
      socket.end(message);
    });
  });
}
