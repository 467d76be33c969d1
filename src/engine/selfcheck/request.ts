import { randomUUID } from 'node:crypto';
import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import type { JobRunner } from '../jobs/job-runner.js';
import { SELF_CHECK_QUEUE } from '../jobs/queues.js';
import { readJobs } from './read.js';
import type { SelfCheckJob, SelfCheckMode, SelfCheckOptions } from './types.js';

/** Findings listed in a report unless `maxFindings` says otherwise. */
export const DEFAULT_MAX_FINDINGS = 100;
/** Keys a sample compares unless `sample` says otherwise. */
export const DEFAULT_SAMPLE = 1_000;

interface Checked {
  mode: SelfCheckMode;
  options: { sample?: number; maxFindings: number; repair: boolean };
}

/** Validates `selfCheck`'s arguments once, at the boundary. */
export function checkArguments(mode: unknown, options: SelfCheckOptions | undefined): Checked {
  if (mode !== 'full' && mode !== 'sample') {
    throw new TrellisError(
      'validation',
      `selfCheck mode must be 'full' or 'sample', got ${String(mode)}`,
    );
  }
  const o = options ?? {};
  if (typeof o !== 'object')
    throw new TrellisError('validation', 'selfCheck options must be an object');
  const count = (name: string, value: unknown, fallback: number) => {
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > 10_000_000) {
      throw new TrellisError(
        'validation',
        `selfCheck ${name} must be an integer from 1 to 10000000, got ${String(value)}`,
      );
    }
    return value;
  };
  if (mode === 'full' && o.sample !== undefined) {
    throw new TrellisError('validation', "selfCheck sample is for mode 'sample' only");
  }
  if (o.repair !== undefined && typeof o.repair !== 'boolean') {
    throw new TrellisError('validation', 'selfCheck repair must be true or false');
  }
  return {
    mode,
    options: {
      ...(mode === 'sample' ? { sample: count('sample', o.sample, DEFAULT_SAMPLE) } : {}),
      maxFindings: count('maxFindings', o.maxFindings, DEFAULT_MAX_FINDINGS),
      repair: o.repair ?? false,
    },
  };
}

/** Fails with `not_migrated` when the catalog predates self-checks (migration 16). */
export async function assertSelfChecksInstalled(session: Session, schema: string): Promise<void> {
  const [row] = await session.query<{ installed: boolean }>(
    'SELECT to_regclass($1) IS NOT NULL AS installed',
    [`${quoteIdent(schema)}.self_checks`],
  );
  if (!row?.installed) {
    throw new TrellisError(
      'not_migrated',
      `the Trellis schema ${schema} predates self-checks: run migrate() (or the install SQL of this version)`,
    );
  }
}

interface TransformRow {
  id: number;
  paused: boolean;
  pause_reason: string | null;
  gaps: Array<{ table: string; columns: string[]; role: string; opted_out: boolean; fix: string }>;
}

/**
 * Starts a self-check of `target`, or returns the one still unfinished for it. The job's
 * row and its pg-boss job are written in one transaction on `session`; the caller wakes
 * the local worker once it has committed. Refuses (`validation`) a target with source
 * index gaps it did not opt out of: each chunk of the check would read whole tables.
 */
export async function requestSelfCheck(
  session: Session,
  schema: string,
  runner: JobRunner,
  target: string,
  checked: Checked,
): Promise<{ job: SelfCheckJob; started: boolean }> {
  const s = quoteIdent(schema);
  return session.transaction(async () => {
    const [t] = await session.query<TransformRow>(
      `SELECT t.id, t.paused_at IS NOT NULL AS paused, t.pause_reason,
              ${s}.source_index_gaps(t.id) AS gaps
         FROM ${s}.transforms t
        WHERE t.target_name = $1 AND t.target_schema = (SELECT target_schema FROM ${s}.config)`,
      [target],
    );
    if (!t) throw new TrellisError('not_found', `there is no transform named ${target}`);
    const gaps = t.gaps.filter((g) => !g.opted_out);
    if (gaps.length > 0) {
      const named = gaps
        .map(
          (g) =>
            `${g.table} (${g.columns.join(', ')}) for its ${g.role.replace('_', ' ')}: ${g.fix} from psql, or ${g.fix.replace(/^CREATE INDEX CONCURRENTLY /, 'CREATE INDEX ')} in a migration`,
        )
        .join('; ');
      throw new TrellisError(
        'validation',
        `${target} lacks source indexes a self-check needs (each chunk would read whole tables): ${named}; or ALTER TRANSFORM ${target} SET WITHOUT SOURCE INDEX to check it anyway`,
      );
    }
    if (t.paused) {
      throw new TrellisError(
        'conflict',
        `${target} is paused (${t.pause_reason ?? 'operator'}): a paused target is left as it is; RESUME it, then check it`,
      );
    }
    for (;;) {
      const [current] = await readJobs(session, schema, 'c.transform_id = $1', [t.id], true);
      if (current && (current.state === 'queued' || current.state === 'running')) {
        return { job: current, started: false };
      }
      const id = randomUUID();
      const written = current
        ? await session.query(
            `UPDATE ${s}.self_checks
                SET id = $2, mode = $3, options = $4, state = 'queued', rows_compared = 0,
                    rows_total = NULL, report = NULL, error = NULL, attempts = 0,
                    created_at = now(), started_at = NULL, finished_at = NULL
              WHERE transform_id = $1`,
            [t.id, id, checked.mode, checked.options],
          )
        : await session.query(
            `INSERT INTO ${s}.self_checks (id, transform_id, mode, options) VALUES ($2, $1, $3, $4)
             ON CONFLICT (transform_id) DO NOTHING RETURNING 1`,
            [t.id, id, checked.mode, checked.options],
          );
      // Another call inserted one first: read it (the lock waits for its transaction).
      if (!current && written.length === 0) continue;
      await runner.send(session, SELF_CHECK_QUEUE, id, { target });
      const [job] = await readJobs(session, schema, 'c.id = $1::uuid', [id]);
      return { job: job!, started: true };
    }
  });
}
