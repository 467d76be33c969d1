import { classifyError } from '../db/classify.js';
import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import type { JobContext, JobHandler } from '../jobs/job-runner.js';
import { SELF_CHECK_QUEUE } from '../jobs/queues.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';
import { CheckStopped, runCheck } from './check.js';
import { lockClaim } from './claim-lock.js';
import type { SelfCheckMode, SelfCheckReport } from './types.js';

/** A check stops itself this long before pg-boss would expire its job (and retry it). */
const EXPIRY_MARGIN_MS = 120_000;

interface Claim {
  transform_id: number;
  target: string;
  mode: SelfCheckMode;
  options: { sample?: number; maxFindings: number; repair: boolean };
}

/**
 * The self-check job (ADR 0015): takes the job's lock, claims its row (gone when the check
 * was replaced or its transform dropped: nothing to do), marks it running, runs the check
 * with its progress recorded as it goes, and records the report, or why it stopped. A lost
 * connection or a shutdown rejects, for pg-boss to retry the job; anything else is the
 * check's own outcome (`failed`, or `cancelled` when the transform was paused).
 */
export function selfCheckHandler(
  schema: string,
  /** Told of each finished check (the handle counts it in its metrics). */
  onDone: (target: string, report: SelfCheckReport) => void = () => undefined,
): JobHandler {
  const s = quoteIdent(schema);
  return async (job, context: JobContext) => {
    const session = await context.acquire();
    const stop = () => session.abort('shutdown', 'the handle shut down during a self-check');
    context.signal.addEventListener('abort', stop, { once: true });
    try {
      // The lock says a live session runs this check (claim-lock.ts); it goes with the
      // session, which is closed at the end rather than returned to the pool.
      if (!(await lockClaim(session, schema, job.id))) {
        throw new TrellisError('conflict', `self-check ${job.id} is running on another session`);
      }
      const [claim] = await session.query<Claim>(
        `UPDATE ${s}.self_checks
            SET state = 'running', started_at = now(), rows_compared = 0, attempts = attempts + 1
          WHERE id = $1 AND state IN ('queued', 'running')
         RETURNING transform_id, mode, options,
                   (SELECT target_name FROM ${s}.transforms t WHERE t.id = transform_id) AS target`,
        [job.id],
      );
      if (!claim) return;
      const finish = (state: string, report: SelfCheckReport | null, error: string | null) =>
        record(session, s, job.id, state, report, error);
      try {
        const report = await runCheck(
          {
            session,
            acquire: context.acquire,
            schema,
            log: context.log,
            signal: context.signal,
            deadline:
              Date.now() + SELF_CHECK_QUEUE.sendOptions.expireInSeconds * 1000 - EXPIRY_MARGIN_MS,
            progress: (rows, total) => progress(session, s, job.id, rows, total),
          },
          {
            transformId: claim.transform_id,
            mode: claim.mode,
            sample: claim.options.sample ?? 0,
            maxFindings: claim.options.maxFindings,
            repair: claim.options.repair,
          },
        );
        await finish('done', report, null);
        onDone(claim.target, report);
        context.log.info(
          { jobId: job.id, outcome: report.outcome, rowsCompared: report.rowsCompared },
          `self-check ${job.id}: ${report.outcome}`,
        );
      } catch (error) {
        if (context.signal.aborted || retriable(error)) throw error;
        if (error instanceof CheckStopped) {
          if (error.state !== 'gone') await finish(error.state, null, error.message);
          return;
        }
        // A transform dropped mid-check takes its row with it: nothing to record.
        if (!(await stillThere(session, s, job.id))) return;
        const classified = classifyError(error, { doing: 'self-check' });
        await finish('failed', null, classified.message);
        context.log.warn({ jobId: job.id, code: classified.code }, classified.message);
      }
    } finally {
      context.signal.removeEventListener('abort', stop);
      await session.release(true);
    }
  };
}

/** Errors worth retrying the job for, on this worker or another. */
function retriable(error: unknown): boolean {
  const classified = classifyError(error);
  if (classified.code === 'connection' || classified.code === 'shutdown') return true;
  const state = sqlstateOf(classified.cause) ?? classified.sqlstate;
  return (
    state === SQLSTATE.deadlockDetected ||
    state === SQLSTATE.serializationFailure ||
    state === SQLSTATE.lockNotAvailable
  );
}

async function progress(
  session: Session,
  s: string,
  id: string,
  rows: number,
  total: number | undefined,
): Promise<void> {
  await session.query(
    `UPDATE ${s}.self_checks SET rows_compared = $2, rows_total = coalesce($3, rows_total)
      WHERE id = $1 AND state = 'running'`,
    [id, rows, total ?? null],
  );
}

async function record(
  session: Session,
  s: string,
  id: string,
  state: string,
  report: SelfCheckReport | null,
  error: string | null,
): Promise<void> {
  await session.query(
    `UPDATE ${s}.self_checks
        SET state = $2, report = $3, error = $4, finished_at = now(),
            rows_compared = coalesce(($3::jsonb ->> 'rowsCompared')::bigint, rows_compared)
      WHERE id = $1 AND state = 'running'`,
    [id, state, report, error],
  );
}

async function stillThere(session: Session, s: string, id: string): Promise<boolean> {
  const rows = await session.query(`SELECT 1 FROM ${s}.self_checks WHERE id = $1`, [id]);
  return rows.length > 0;
}
