import type { Session } from '../db/session.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import { LOCK_CLASS, lockHeldExpr } from '../internal/advisory-locks.js';
import { jobsSchemaFor } from '../jobs/jobs-schema.js';
import { SELF_CHECK_QUEUE } from '../jobs/queues.js';

/*
 * Who is running a check. The session that runs a self-check holds an advisory lock of
 * its own job, taken before it claims the job's row and kept until the session is closed.
 * A row claimed (`running`) by the job's current activation, with no session holding its
 * lock, was left by a worker that is gone: killed, or stopped without its hand-back
 * reaching pg-boss. Such a job reads as `queued`, and the next working handle hands it
 * back to pg-boss at once (`abandonedChecks`), instead of it waiting for pg-boss to
 * expire it an hour later.
 */

/** The lock's second key for job `idSql` of the instance in `schema`, as SQL. */
function lockKeySql(schema: string, idSql: string): string {
  return `hashtext(${quoteLiteral(`${schema}:`)} || ${idSql})`;
}

/** Takes the lock of job `id`; false when another session holds it (runs the check). */
export async function lockClaim(session: Session, schema: string, id: string): Promise<boolean> {
  const [row] = await session.query<{ locked: boolean }>(
    `SELECT pg_try_advisory_lock(${LOCK_CLASS.selfCheck}, ${lockKeySql(schema, '$1')}) AS locked`,
    [id],
  );
  return row?.locked === true;
}

/**
 * SQL true when check row `c` was claimed by its job's current activation (pg-boss row
 * `j`, with `state` and `started_on`) and no session holds the job's lock: its worker is
 * gone.
 */
export function abandonedSql(schema: string, c: string, j: string): string {
  return `(${c}.state = 'running' AND ${j}.state = 'active' AND ${c}.started_at >= ${j}.started_on
    AND NOT ${lockHeldExpr(LOCK_CLASS.selfCheck, lockKeySql(schema, `${c}.id::text`))})`;
}

/**
 * Ids of the instance's checks whose worker is gone, their pg-boss rows locked for the
 * caller's transaction (which hands them back).
 */
export async function abandonedChecks(session: Session, schema: string): Promise<string[]> {
  const jobs = quoteIdent(jobsSchemaFor(schema));
  const rows = await session.query<{ id: string }>(
    `SELECT c.id::text AS id
       FROM ${quoteIdent(schema)}.self_checks c
       JOIN ${jobs}.job j ON j.name = ${quoteLiteral(SELF_CHECK_QUEUE.name)} AND j.id = c.id
      WHERE ${abandonedSql(schema, 'c', 'j')}
        FOR UPDATE OF j SKIP LOCKED`,
  );
  return rows.map((row) => row.id);
}
