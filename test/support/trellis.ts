import { type Lifecycle, type Status, Trellis } from '../../src/engine/index.js';
import type { ConnectOptions } from '../../src/engine/options.js';
import type { TestDatabase } from './database.js';
import { quietLogger } from './recent-logs.js';

export { quietLogger } from './recent-logs.js';

/**
 * Connects a handle to a test database with the catalog schema installed (by a plain
 * handle first, as a deploy's migration step would: a staging handle needs it done).
 */
export async function migratedTrellis(
  db: TestDatabase,
  options: Partial<ConnectOptions> = {},
): Promise<Trellis> {
  const base = { url: db.url, logger: quietLogger, ...options };
  const migrator = await Trellis.connect({ ...base, staging: false, drainThreads: 0 });
  try {
    await migrator.migrate();
  } finally {
    await migrator.shutdown();
  }
  return Trellis.connect(base);
}

/** The error a promise rejects with (fails the test if it resolves). */
export async function rejection(
  promise: Promise<unknown>,
): Promise<Error & Record<string, unknown>> {
  try {
    await promise;
  } catch (error) {
    return error as Error & Record<string, unknown>;
  }
  throw new Error('expected the call to fail, and it succeeded');
}

/** Polls status() until the transform reaches `status` (fails after `timeoutMs`). */
export async function waitForStatus(
  trellis: Trellis,
  target: string,
  status: Lifecycle,
  timeoutMs = 20_000,
): Promise<Status> {
  const deadline = Date.now() + timeoutMs;
  let last: Status | undefined;
  while (Date.now() < deadline) {
    last = await trellis.status(target);
    if (last.status === status) return last;
    await new Promise((resolve) => setTimeout(resolve, 25)); // the poll interval of this wait
  }
  throw new Error(
    `${target} did not reach ${status} within ${timeoutMs} ms: ${JSON.stringify(last)}`,
  );
}

/** Polls `check` until it returns true (fails after `timeoutMs`, naming `what`). */
export async function waitFor(
  check: () => Promise<boolean>,
  what: string,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 25)); // the poll interval of this wait
  }
  throw new Error(`timed out waiting for ${what}`);
}

/**
 * awaitConverged with a long timeout (the wait is the caller's to choose, past the call
 * timeout: ADR 0011) that, when the target still lags, fails with the target's status.
 * For soak runs, whose workloads leave much more to drain.
 */
export async function awaitConvergedWithin(
  trellis: Trellis,
  target: string,
  token: string,
  timeoutMs: number,
): Promise<void> {
  try {
    await trellis.awaitConverged(target, token, { timeoutMs });
  } catch (error) {
    if ((error as { code?: string }).code !== 'timeout') throw error;
    const status = await trellis.status(target);
    throw new Error(
      `${target} did not converge within ${timeoutMs} ms; its status: ${JSON.stringify(status)}`,
      { cause: error },
    );
  }
}
