import type { Logger, LogLevel } from '../logger.js';

/** Lines waiting for the app's logger; past this, new lines are dropped (and counted). */
export const LOG_BUFFER_LINES = 1_000;

/** Lines handed to the logger in one turn of the event loop, at most (and within BATCH_MS). */
const BATCH_LINES = 100;
const BATCH_MS = 10;

/**
 * A logger call that returns a promise (an async logger) is waited for before the next
 * line, at most this long: lines queue meanwhile instead of piling up in the logger.
 */
const LINE_TIMEOUT_MS = 5_000;

/**
 * A logger call that ran this long synchronously is slow: the next line waits
 * SLOW_PAUSE_FACTOR times as long, so a slow logger gets at most a fifth of the process's
 * time and the engine the rest. Lines queue meanwhile, and drop past the buffer.
 */
const SLOW_CALL_MS = 20;
const SLOW_PAUSE_FACTOR = 4;

/** One drop warning per this interval at most, saying how many lines went since the last. */
const DROP_WARNING_MS = 1_000;

interface Line {
  level: LogLevel;
  obj: Record<string, unknown>;
  msg: string;
}

/**
 * Hands the engine's log lines to the app's logger without ever blocking or breaking the
 * engine: a line is put in a bounded buffer (O(1), never calls the logger) and delivered
 * later, in small batches on the event loop. A logger that throws loses that line; one
 * that returns a promise is waited for (with a deadline) before the next line; one that is
 * slow synchronously is given lines less often. When the buffer is full, new lines are
 * dropped, and one warning says how many (at most one a second) when delivery goes on —
 * as the seed's LogBridge does.
 */
export class LogBridge implements Logger {
  private readonly queue: Line[] = [];
  private head = 0;
  private dropped = 0;
  private lastDropWarning = 0;
  /** A delivery is scheduled, or waiting for an async logger. */
  private busy = false;
  /** When the next line may be delivered (after a slow call). */
  private notBefore = 0;
  private idleWaiters: Array<() => void> = [];
  private closed = false;

  constructor(
    private readonly target: Logger,
    private readonly fields: Record<string, unknown>,
    private readonly onDropped: (lines: number) => void = () => undefined,
    private readonly capacity = LOG_BUFFER_LINES,
  ) {}

  debug(obj: Record<string, unknown>, msg: string): void {
    this.push('debug', obj, msg);
  }
  info(obj: Record<string, unknown>, msg: string): void {
    this.push('info', obj, msg);
  }
  warn(obj: Record<string, unknown>, msg: string): void {
    this.push('warn', obj, msg);
  }
  error(obj: Record<string, unknown>, msg: string): void {
    this.push('error', obj, msg);
  }

  /** Lines waiting for delivery. */
  get pending(): number {
    return this.queue.length - this.head;
  }

  /**
   * Resolves once every line queued so far was handed over, or after `timeoutMs` (a
   * logger that never catches up must not hold up shutdown).
   */
  flush(timeoutMs: number): Promise<void> {
    if (this.pending === 0 && this.dropped === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, timeoutMs);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.idleWaiters.push(done);
    });
  }

  /**
   * The handle is gone: lines still queued are dropped, so a logger that never catches up
   * cannot keep the process alive.
   */
  close(): void {
    this.closed = true;
    this.queue.length = 0;
    this.head = 0;
    this.dropped = 0;
    for (const resolve of this.idleWaiters.splice(0)) resolve();
  }

  private push(level: LogLevel, obj: Record<string, unknown>, msg: string): void {
    if (this.closed) return;
    if (this.pending >= this.capacity) {
      this.dropped += 1;
      try {
        this.onDropped(1);
      } catch {
        // Counting is best effort.
      }
      return;
    }
    this.queue.push({ level, obj: { ...this.fields, ...obj }, msg });
    this.schedule();
  }

  private schedule(): void {
    if (this.busy) return;
    this.busy = true;
    const wait = this.notBefore - Date.now();
    if (wait > 0) {
      // Unref'd: a slow logger's pause must not keep the process up.
      setTimeout(() => this.deliver(), wait).unref();
    } else {
      setImmediate(() => this.deliver());
    }
  }

  private next(): Line | undefined {
    if (this.dropped > 0 && Date.now() - this.lastDropWarning >= DROP_WARNING_MS) {
      const count = this.dropped;
      this.dropped = 0;
      this.lastDropWarning = Date.now();
      return {
        level: 'warn',
        obj: { ...this.fields, dropped: count },
        msg: `${count} log line${count === 1 ? ' was' : 's were'} dropped: the logger fell behind`,
      };
    }
    if (this.head >= this.queue.length) return undefined;
    const line = this.queue[this.head]!;
    this.queue[this.head] = undefined as unknown as Line;
    this.head += 1;
    // Compact now and then, so the array does not grow for ever.
    if (this.head >= 1024 && this.head * 2 >= this.queue.length) {
      this.queue.splice(0, this.head);
      this.head = 0;
    }
    return line;
  }

  private deliver(): void {
    const started = Date.now();
    for (let n = 0; n < BATCH_LINES && Date.now() - started < BATCH_MS; n += 1) {
      const line = this.next();
      if (!line) break;
      const callStarted = Date.now();
      const returned = this.call(line);
      const took = Date.now() - callStarted;
      if (isThenable(returned)) {
        // An async logger: the next line waits for this one (with a deadline).
        void this.awaitLine(returned);
        return;
      }
      if (took >= SLOW_CALL_MS) {
        this.notBefore = Date.now() + took * SLOW_PAUSE_FACTOR;
        break;
      }
    }
    this.busy = false;
    if (this.pending > 0 || this.dropped > 0) {
      if (this.pending === 0) {
        // Only a drop warning is left: it goes out when its interval allows.
        this.notBefore = Math.max(this.notBefore, this.lastDropWarning + DROP_WARNING_MS);
      }
      this.schedule();
    } else {
      for (const resolve of this.idleWaiters.splice(0)) resolve();
    }
  }

  private async awaitLine(returned: PromiseLike<unknown>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        Promise.resolve(returned).catch(() => undefined),
        new Promise<void>((resolve) => {
          // Unref'd: a logger's promise that never settles must not keep the process up.
          timer = setTimeout(resolve, LINE_TIMEOUT_MS).unref();
        }),
      ]);
    } finally {
      clearTimeout(timer);
      this.busy = false;
      if (this.pending > 0 || this.dropped > 0) this.schedule();
      else for (const resolve of this.idleWaiters.splice(0)) resolve();
    }
  }

  /** Calls the logger; whatever it throws is swallowed: a broken logger loses its line. */
  private call(line: Line): unknown {
    try {
      const method = this.target[line.level];
      if (typeof method !== 'function') return undefined;
      return method.call(this.target, line.obj, line.msg);
    } catch {
      return undefined;
    }
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    value !== null &&
    (typeof value === 'object' || typeof value === 'function') &&
    typeof (value as { then?: unknown }).then === 'function'
  );
}
