import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import { jobsSchemaFor } from '../jobs/jobs-schema.js';
import { SELF_CHECK_QUEUE } from '../jobs/queues.js';
import { abandonedSql } from './claim-lock.js';
import type { SelfCheckJob, SelfCheckMode, SelfCheckReport, SelfCheckState } from './types.js';

interface JobRow {
  id: string;
  target: string;
  mode: SelfCheckMode;
  state: SelfCheckState;
  rows_compared: string;
  rows_total: string | null;
  report: (Omit<SelfCheckReport, 'heldKeys' | 'drainFailures'> & Record<string, unknown>) | null;
  error: string | null;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
  boss_state: string | null;
  /** Claimed by a worker that is gone (claim-lock.ts): pg-boss retries it soon. */
  abandoned: boolean;
  boss_output: { message?: unknown } | null;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Refuses an id that is not a job id (a UUID). */
export function assertJobId(id: unknown): asserts id is string {
  if (typeof id !== 'string' || !UUID.test(id)) {
    throw new TrellisError(
      'validation',
      'not a self-check job id: pass the id selfCheck() returned',
    );
  }
}

/**
 * Self-check jobs with their state as it stands: the row the worker writes, reconciled
 * with pg-boss's state of the job (ADR 0015). A row left `running` by a worker that is
 * gone is `queued` (claim-lock.ts), and `failed` once pg-boss gives up retrying it; a row
 * whose job pg-boss no longer has is `failed`.
 */
export async function readJobs(
  session: Session,
  schema: string,
  where: string,
  params: unknown[],
  lock = false,
): Promise<SelfCheckJob[]> {
  const s = quoteIdent(schema);
  const jobs = jobsSchemaFor(schema);
  const queue = quoteLiteral(SELF_CHECK_QUEUE.name);
  if (lock) {
    // Locked first, read after, in a statement of its own: a locked row updated while
    // the lock waited is re-checked on its own columns only, and the pg-boss job joined
    // to it would be the one from before the wait (a check another call had just queued
    // would read as the old job's outcome, and be queued again over it).
    await session.query(`SELECT 1 FROM ${s}.self_checks c WHERE ${where} FOR UPDATE OF c`, params);
  }
  const rows = await session.query<JobRow>(
    `SELECT c.id::text, t.target_name AS target, c.mode, c.state, c.rows_compared, c.rows_total,
            c.report, c.error, c.created_at, c.started_at, c.finished_at,
            b.state AS boss_state, b.output AS boss_output,
            coalesce(${abandonedSql(schema, 'c', 'b')}, false) AS abandoned
       FROM ${s}.self_checks c
       JOIN ${s}.transforms t ON t.id = c.transform_id
       LEFT JOIN LATERAL (
         SELECT j.state::text, j.output, j.started_on FROM ${jobs}.job j
          WHERE j.name = ${queue} AND j.id = c.id
         UNION ALL
         SELECT a.state::text, a.output, a.started_on FROM ${jobs}.archive a WHERE a.name = ${queue} AND a.id = c.id
         LIMIT 1) b ON true
      WHERE ${where}`,
    params,
  );
  return rows.map(toJob);
}

function toJob(row: JobRow): SelfCheckJob {
  let state = row.state;
  let error = row.error;
  let rowsCompared = Number(row.rows_compared);
  if (state === 'queued' || state === 'running') {
    switch (row.boss_state) {
      case 'created':
      case 'retry':
        state = 'queued';
        rowsCompared = 0;
        break;
      case 'active':
        state = row.abandoned ? 'queued' : 'running';
        break;
      case 'cancelled':
        state = 'cancelled';
        error = 'the job was cancelled';
        break;
      case 'failed': {
        const message = row.boss_output?.message;
        state = 'failed';
        error = typeof message === 'string' ? message : 'the job failed';
        break;
      }
      default:
        // Completed without a recorded outcome, or gone from pg-boss (archived and purged).
        state = 'failed';
        error = 'the job ended without recording an outcome';
    }
  }
  return {
    id: row.id,
    target: row.target,
    mode: row.mode,
    state,
    rowsCompared,
    rowsTotal: row.rows_total === null ? null : Number(row.rows_total),
    report: row.report ? toReport(row.report) : null,
    error,
    createdAt: row.created_at,
    startedAt: row.started_at,
    finishedAt: row.finished_at,
  };
}

/** A report as stored (JSON): its times back to Dates. */
function toReport(stored: Record<string, unknown>): SelfCheckReport {
  const report = stored as unknown as SelfCheckReport & {
    heldKeys: { count: number; oldestPoisonedAt: string | null };
    drainFailures: Array<{ since: string; lastSeen: string }>;
  };
  return {
    ...report,
    heldKeys: {
      count: report.heldKeys.count,
      oldestPoisonedAt: report.heldKeys.oldestPoisonedAt
        ? new Date(report.heldKeys.oldestPoisonedAt)
        : null,
    },
    drainFailures: report.drainFailures.map((f) => ({
      ...(f as unknown as SelfCheckReport['drainFailures'][number]),
      since: new Date(f.since),
      lastSeen: new Date(f.lastSeen),
    })),
  };
}

/** `selfCheckJob(id)`: the job, or null when it was replaced or its transform dropped. */
export async function readJob(
  session: Session,
  schema: string,
  id: string,
): Promise<SelfCheckJob | null> {
  const [job] = await readJobs(session, schema, 'c.id = $1::uuid', [id]);
  return job ?? null;
}
