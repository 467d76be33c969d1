import type { SelfCheckJob, Trellis } from '../../src/engine/index.js';
import type { TestDatabase } from './database.js';

/** Polls selfCheckJob until the job is finished (done, failed or cancelled). */
export async function finishedJob(
  trellis: Trellis,
  id: string,
  timeoutMs = 30_000,
  onProgress?: (job: SelfCheckJob) => void,
): Promise<SelfCheckJob> {
  const deadline = Date.now() + timeoutMs;
  let last: SelfCheckJob | null = null;
  while (Date.now() < deadline) {
    last = await trellis.selfCheckJob(id);
    if (!last) throw new Error(`self-check job ${id} is gone`);
    onProgress?.(last);
    if (last.state === 'done' || last.state === 'failed' || last.state === 'cancelled') return last;
    await new Promise((resolve) => setTimeout(resolve, 20)); // the poll interval of this wait
  }
  throw new Error(
    `self-check job ${id} did not finish within ${timeoutMs} ms: ${JSON.stringify(last)}`,
  );
}

/** Starts a check and waits for it to finish. */
export async function checked(
  trellis: Trellis,
  target: string,
  options: Parameters<Trellis['selfCheck']>[2] & { mode?: 'full' | 'sample' } = {},
  timeoutMs = 30_000,
): Promise<SelfCheckJob> {
  const { mode = 'full', ...rest } = options;
  const job = await trellis.selfCheck(target, mode, rest);
  return finishedJob(trellis, job.id, timeoutMs);
}

/**
 * Changes a target behind the engine's back: the guard trigger disabled for the
 * statements and enabled again in the same transaction (so the staging worker never sees
 * it disabled, which would halt the transform).
 */
export async function corrupt(db: TestDatabase, target: string, statements: string): Promise<void> {
  await db.sql.begin(async (tx) => {
    await tx.unsafe(`ALTER TABLE ${target} DISABLE TRIGGER trellis_guard`);
    await tx.unsafe(statements);
    await tx.unsafe(`ALTER TABLE ${target} ENABLE ALWAYS TRIGGER trellis_guard`);
  });
}
