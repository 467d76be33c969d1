import { classifyError } from './db/classify.js';
import type { ConnectionPool } from './db/pool.js';
import type { Session } from './db/session.js';
import { TrellisError } from './errors.js';
import { SQLSTATE, sqlstateOf } from './sqlstate.js';

interface InFlight {
  session: Session | undefined;
  fail: (error: TrellisError) => void;
}

/**
 * Runs the handle's calls: each gets its own pooled session, settles within the call
 * timeout (cancelling its server-side work when it does not), and is cancelled by
 * `shutdown`. Calls never wait on each other beyond the pool cap.
 */
export class CallRunner {
  private readonly inFlight = new Set<InFlight>();
  private shutDown = false;
  private readonly unsettled = new Set<Promise<unknown>>();

  constructor(
    private readonly pool: ConnectionPool,
    private readonly options: { callTimeoutMs: number; acquireTimeoutMs: number },
    /** Told how each call (but internal ones) ended: "ok" or its error code (metrics). */
    private readonly onSettled: (what: string, outcome: string, seconds: number) => void = () =>
      undefined,
  ) {}

  get isShutDown(): boolean {
    return this.shutDown;
  }

  /**
   * Runs `fn` on a pooled session as call `what`. `timeoutMs` shortens the deadline (never
   * past the call timeout); an `internal` call (the handle's own reads for metrics and
   * events) is not counted in the call metrics.
   */
  run<T>(
    what: string,
    fn: (session: Session) => Promise<T>,
    options: { timeoutMs?: number; internal?: boolean } = {},
  ): Promise<T> {
    const counted = options.internal ? undefined : this.onSettled;
    const called = performance.now();
    const result = this.runCall(what, fn, options.timeoutMs);
    if (counted) {
      const seconds = () => (performance.now() - called) / 1000;
      result.then(
        () => report(counted, what, 'ok', seconds()),
        (error: unknown) =>
          report(counted, what, error instanceof TrellisError ? error.code : 'unknown', seconds()),
      );
    }
    return result;
  }

  private runCall<T>(
    what: string,
    fn: (session: Session) => Promise<T>,
    timeoutOverrideMs: number | undefined,
  ): Promise<T> {
    if (this.shutDown) {
      return Promise.reject(new TrellisError('shutdown', `${what}: the handle is shut down`));
    }
    const started = Date.now();
    const timeoutMs = Math.min(this.options.callTimeoutMs, timeoutOverrideMs ?? Infinity);
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      const call: InFlight = {
        session: undefined,
        fail: (error) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          call.session?.abort(error.code as 'timeout' | 'shutdown', error.message);
          reject(error);
        },
      };
      const timeoutError = () =>
        new TrellisError('timeout', `${what} did not settle within ${timeoutMs} ms`);
      const timer = setTimeout(() => call.fail(timeoutError()), timeoutMs);
      this.inFlight.add(call);

      const work = (async () => {
        const wait = Math.min(this.options.acquireTimeoutMs, timeoutMs - (Date.now() - started));
        const session = await this.pool.acquire(Math.max(0, wait));
        if (settled) {
          await session.release();
          return;
        }
        call.session = session;
        try {
          const value = await fn(session);
          if (!settled) {
            settled = true;
            clearTimeout(timer);
            resolve(value);
          }
        } finally {
          await session.release();
        }
      })().catch((error: unknown) => {
        if (!settled) {
          // The server's statement_timeout (the pool's safety net, equal to the call
          // timeout) can beat our timer by a millisecond or two when the call's last
          // statement started right at the call's start. A call cancelled that way has
          // missed its deadline: it reports `timeout`, as when our own timer fires first.
          if (sqlstateOf(error) === SQLSTATE.queryCanceled && Date.now() - started >= timeoutMs) {
            call.fail(timeoutError());
            return;
          }
          settled = true;
          clearTimeout(timer);
          reject(classifyError(error, { doing: what }));
        }
      });
      this.unsettled.add(work);
      void work.finally(() => {
        this.inFlight.delete(call);
        this.unsettled.delete(work);
      });
    });
  }

  /** Rejects every call in flight with `shutdown`, cancels their queries, and waits for them to unwind. */
  async shutdown(): Promise<void> {
    this.shutDown = true;
    for (const call of this.inFlight) {
      call.fail(new TrellisError('shutdown', 'the handle was shut down while the call ran'));
    }
    this.pool.refuseNew();
    await Promise.allSettled([...this.unsettled]);
  }
}

function report(
  onSettled: (what: string, outcome: string, seconds: number) => void,
  what: string,
  outcome: string,
  seconds: number,
): void {
  try {
    onSettled(what, outcome, seconds);
  } catch {
    // Metrics are best effort: they never change what a call returns.
  }
}
