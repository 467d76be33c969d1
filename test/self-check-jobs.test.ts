import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { SelfCheckJob, Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { transformStatement } from './support/oracle.js';
import { killAllWorkerProcesses, killHard, startWorkerProcess } from './support/processes.js';
import { finishedJob } from './support/self-check.js';
import { migratedTrellis, rejection, waitFor, waitForStatus } from './support/trellis.js';

// Self-checks as pg-boss jobs (issue #11, ADR 0014): the job's life as selfCheck and
// selfCheckJob show it, which handles work jobs, and the jobs schema of each instance.

let db: TestDatabase;
/** Staging worker, no drain: builds nothing alone, works no job. */
let staging: Trellis;
/** A handle that only sends (the defaults). */
let sender: Trellis;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE jb_items (id int PRIMARY KEY, price numeric NOT NULL, grp int NOT NULL);
    INSERT INTO jb_items SELECT i, i, i % 10 FROM generate_series(1, 1000) i;`);
  staging = await migratedTrellis(db, { staging: true, applicationName: 'jb-staging' });
  sender = await migratedTrellis(db, { applicationName: 'jb-sender' });
});

afterAll(async () => {
  await killAllWorkerProcesses();
  await staging?.shutdown();
  await sender?.shutdown();
});

function stagingHandle(): Promise<Trellis> {
  return migratedTrellis(db, { staging: true, applicationName: 'jb-staging' });
}

/**
 * A check of a new transform over jb_items that `drainer` has started and cannot finish
 * yet: the transform is rebuilt (requestBackfill) while the instance's staging worker is
 * stopped, so it waits to be rebuilt and the check, running, waits for it. The caller
 * starts a staging worker again (stagingHandle) to let both go on. (Holding a lock on the
 * target instead would hold a transaction id, and with it every other test file's xmin.)
 */
async function runningCheck(target: string, drainer: Trellis = sender): Promise<SelfCheckJob> {
  await staging.apply(transformStatement({ target, from: 'jb_items', select: 'price' }));
  await waitForStatus(drainer, target, 'live');
  await staging.shutdown();
  await sender.requestBackfill(target);
  const job = await sender.selfCheck(target, 'full');
  // selfCheckJob says `running` as soon as pg-boss hands the job out; the worker claims
  // it (its own row says `running`) a moment later, on the session the check then holds.
  // Wait for the claim, so that what the caller does next meets the check itself.
  await waitFor(async () => {
    const [row] = await db.sql<{ state: string }[]>`
      SELECT state FROM trellis.self_checks WHERE id = ${job.id}`;
    return row?.state === 'running' && (await sender.selfCheckJob(job.id))?.state === 'running';
  }, 'the worker to claim the job');
  return job;
}

// A test that stopped the staging worker and failed before starting it again.
afterEach(async () => {
  if (await sender.hasLiveStagingWorker()) return;
  await staging.shutdown();
  staging = await stagingHandle();
});

/** A handle with drain loops (it works jobs), for a test to shut down. */
function worker(applicationName = 'jb-worker'): Promise<Trellis> {
  return migratedTrellis(db, { drainThreads: 1, applicationName });
}

async function backends(applicationName: string): Promise<number> {
  const [row] = await db.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_stat_activity
     WHERE datname = ${db.name} AND application_name = ${applicationName}`;
  return row?.n ?? 0;
}

describe('self-check jobs', () => {
  it('installs pg-boss in a jobs schema of the instance, with the self-check queue', async () => {
    const [row] = await db.sql<{ version: number; queue: string }[]>`
      SELECT (SELECT version FROM trellis_jobs.version) AS version,
             (SELECT name FROM trellis_jobs.queue) AS queue`;
    expect(row).toEqual({ version: 24, queue: 'self_check' });
  });

  it('stays queued with no drain worker anywhere; asking again returns it; a worker then runs it', async () => {
    await staging.apply(
      transformStatement({ target: 'jb_prices', from: 'jb_items', select: 'price' }),
    );
    const first = await sender.selfCheck('jb_prices', 'full');
    expect(first).toMatchObject({
      target: 'jb_prices',
      mode: 'full',
      state: 'queued',
      rowsCompared: 0,
      rowsTotal: null,
      report: null,
      error: null,
      startedAt: null,
      finishedAt: null,
    });
    expect(first.createdAt).toBeInstanceOf(Date);
    expect(await sender.hasLiveDrainWorkers()).toBe(false);
    // Nothing could have taken it, rather than nothing did yet: no session in the database
    // works jobs (pg-boss's sessions are `<applicationName>:jobs`), the sender's and the
    // staging worker's included.
    expect(await backends('jb-sender:jobs')).toBe(0);
    expect(await backends('jb-staging:jobs')).toBe(0);
    const [jobSessions] = await db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_stat_activity
       WHERE datname = ${db.name} AND application_name LIKE '%:jobs'`;
    expect(jobSessions?.n).toBe(0);
    expect((await sender.selfCheckJob(first.id))?.state).toBe('queued');
    const again = await sender.selfCheck('jb_prices', 'sample', { sample: 10 });
    expect(again.id).toBe(first.id);
    expect(again.mode).toBe('full');

    const drainer = await worker();
    try {
      await waitForStatus(drainer, 'jb_prices', 'live');
      const done = await finishedJob(sender, first.id);
      expect(done).toMatchObject({ state: 'done', rowsCompared: 1000, rowsTotal: 1000 });
      expect(done.report?.outcome).toBe('consistent');
      expect(done.startedAt).toBeInstanceOf(Date);
      expect(done.finishedAt).toBeInstanceOf(Date);
      // (The check's own session is closed when it ends; pg-boss's stays.)
      await waitFor(
        async () => (await backends('jb-worker:jobs')) > 0,
        "the worker's jobs session",
      );

      // The next call replaces the finished job: the old one is gone.
      const next = await sender.selfCheck('jb_prices', 'sample', { sample: 10 });
      expect(next.id).not.toBe(first.id);
      expect(await sender.selfCheckJob(first.id)).toBeNull();
      const sampled = await finishedJob(sender, next.id);
      expect(sampled).toMatchObject({ state: 'done', mode: 'sample' });
      expect(sampled.report?.rowsCompared).toBeGreaterThan(0);
      expect(sampled.report?.rowsCompared).toBeLessThanOrEqual(10);
    } finally {
      await drainer.shutdown();
    }
    expect(await backends('jb-worker:jobs')).toBe(0);
  });

  it('starts one check for calls made at once over a finished one, and each call returns it', async () => {
    await staging.apply(
      transformStatement({ target: 'jb_twice', from: 'jb_items', select: 'price' }),
    );
    const other = await migratedTrellis(db, { applicationName: 'jb-other' });
    const drainer = await worker('jb-worker-twice');
    try {
      await waitForStatus(drainer, 'jb_twice', 'live');
      /** Waits until pg-boss, too, has the job done (it completes it after the handler). */
      const completed = (id: string) =>
        waitFor(async () => {
          const [row] = await db.sql<{ state: string }[]>`
            SELECT state::text FROM trellis_jobs.job WHERE id = ${id}::uuid
            UNION ALL SELECT state::text FROM trellis_jobs.archive WHERE id = ${id}::uuid`;
          return row?.state === 'completed';
        }, 'pg-boss to complete the job');
      const first = await sender.selfCheck('jb_twice', 'full');
      expect((await finishedJob(sender, first.id)).state).toBe('done');
      await completed(first.id);
      // Each round, the check before is finished, so either call alone would replace it;
      // made at once, the second waits for the first and must find its check queued (a
      // second one queued over it would leave the first caller's id pointing nowhere).
      for (let round = 0; round < 3; round += 1) {
        const calls = await Promise.all([
          sender.selfCheck('jb_twice', 'full'),
          other.selfCheck('jb_twice', 'sample', { sample: 10 }),
          sender.selfCheck('jb_twice', 'full'),
          other.selfCheck('jb_twice', 'sample', { sample: 10 }),
        ]);
        const a = calls[0]!;
        expect(calls.map((c) => c.id)).toEqual(calls.map(() => a.id));
        for (const c of calls) expect(await sender.selfCheckJob(c.id)).not.toBeNull();
        const done = await finishedJob(sender, a.id);
        expect(done.state).toBe('done');
        expect(done.report?.outcome).toBe('consistent');
        await completed(a.id);
      }
    } finally {
      await drainer.shutdown();
      await other.shutdown();
    }
  });

  it('shows a job running, hands it back when its worker shuts down, and another finishes it', async () => {
    let drainer = await worker('jb-worker-1');
    try {
      const job = await runningCheck('jb_held', drainer);
      // The worker goes away mid-check: promptly (recording the hand-back takes at most
      // 5 s), and the job is queued again.
      const stopping = Date.now();
      await drainer.shutdown();
      expect(Date.now() - stopping).toBeLessThan(10_000);
      // (On a loaded machine the record can outlast shutdown's wait for it, and land later.)
      await waitFor(
        async () => (await sender.selfCheckJob(job.id))?.state === 'queued',
        'the job to be queued again',
        30_000,
      );
      staging = await stagingHandle();
      drainer = await worker('jb-worker-2');
      const done = await finishedJob(sender, job.id, 40_000);
      expect(done.state).toBe('done');
      expect(done.report?.outcome).toBe('consistent');
    } finally {
      await drainer.shutdown();
    }
  });

  it('hands back at once a check whose worker process was killed -9 mid-check', async () => {
    const doomed = await startWorkerProcess(db.url, {
      drainThreads: 1,
      staging: false,
      applicationName: 'jb-doomed',
    });
    const job = await runningCheck('jb_killed');
    await killHard(doomed);
    // Its session's end frees the job's lock: the job reads queued at once, not running
    // until pg-boss expires it an hour later.
    await waitFor(
      async () => (await sender.selfCheckJob(job.id))?.state === 'queued',
      "the killed worker's job to read queued",
      30_000,
    );
    staging = await stagingHandle();
    const drainer = await worker('jb-worker-after-kill');
    try {
      const done = await finishedJob(sender, job.id, 60_000);
      expect(done).toMatchObject({ state: 'done', rowsCompared: 1000 });
      expect(done.report?.outcome).toBe('consistent');
      const [row] = await db.sql<{ attempts: number }[]>`
        SELECT attempts FROM trellis.self_checks WHERE id = ${job.id}`;
      expect(row?.attempts).toBe(2);
    } finally {
      await drainer.shutdown();
    }
  });

  it('retries a check whose worker lost its connections mid-check, and finishes it', async () => {
    const drainer = await worker('jb-worker-cut');
    try {
      const job = await runningCheck('jb_cut', drainer);
      await db.sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                    WHERE application_name = 'jb-worker-cut:jobs'`;
      staging = await stagingHandle();
      const done = await finishedJob(sender, job.id, 40_000);
      expect(done).toMatchObject({ state: 'done', rowsCompared: 1000 });
      const [row] = await db.sql<{ attempts: number }[]>`
        SELECT attempts FROM trellis.self_checks WHERE id = ${job.id}`;
      expect(row?.attempts).toBe(2);
    } finally {
      await drainer.shutdown();
    }
  });

  it('cancels a check whose transform is paused while it runs, and refuses a paused one', async () => {
    const drainer = await worker();
    try {
      const job = await runningCheck('jb_paused', drainer);
      await sender.apply('PAUSE TRANSFORM jb_paused');
      const cancelled = await finishedJob(sender, job.id);
      expect(cancelled.state).toBe('cancelled');
      expect(cancelled.error).toMatch(/jb_paused was paused \(operator\)/);
      const refused = await rejection(sender.selfCheck('jb_paused', 'full'));
      expect(refused).toMatchObject({ code: 'conflict' });
      expect(refused.message).toMatch(/paused.*RESUME/);
    } finally {
      staging = await stagingHandle();
      await drainer.shutdown();
    }
  });

  it('returns null for a job whose transform was dropped', async () => {
    await staging.apply(
      transformStatement({ target: 'jb_dropped', from: 'jb_items', select: 'price' }),
    );
    const job = await sender.selfCheck('jb_dropped', 'full');
    await sender.apply('PAUSE TRANSFORM jb_dropped');
    await sender.apply('DROP TRANSFORM jb_dropped');
    expect(await sender.selfCheckJob(job.id)).toBeNull();
  });

  it('reports a job pg-boss gave up on as failed, with its error', async () => {
    await staging.apply(
      transformStatement({ target: 'jb_failed', from: 'jb_items', select: 'price' }),
    );
    const job = await sender.selfCheck('jb_failed', 'full');
    // What pg-boss records when a job's retries run out (its last error as output).
    await db.sql`UPDATE trellis_jobs.job SET state = 'failed', output = '{"message": "it broke"}'
                  WHERE id = ${job.id}`;
    expect(await sender.selfCheckJob(job.id)).toMatchObject({ state: 'failed', error: 'it broke' });
    // A failed job is finished: the next call replaces it.
    expect((await sender.selfCheck('jb_failed', 'full')).id).not.toBe(job.id);
  });

  it('refuses a target with source index gaps, naming them and their fix, unless it opted out', async () => {
    await staging.apply(
      transformStatement({
        target: 'jb_groups',
        from: 'jb_items',
        select: 'grp, sum(price) AS total',
        groupBy: 'grp',
      }),
    );
    const refused = await rejection(sender.selfCheck('jb_groups', 'full'));
    expect(refused).toMatchObject({ code: 'validation' });
    expect(refused.message).toContain('public.jb_items (grp)');
    expect(refused.message).toContain('CREATE INDEX CONCURRENTLY ON public.jb_items (grp)');
    expect(refused.message).toContain('WITHOUT SOURCE INDEX');
    await sender.apply('ALTER TRANSFORM jb_groups SET WITHOUT SOURCE INDEX');
    const drainer = await worker();
    try {
      await waitForStatus(drainer, 'jb_groups', 'live');
      const job = await sender.selfCheck('jb_groups', 'full');
      expect((await finishedJob(sender, job.id)).report?.outcome).toBe('consistent');
    } finally {
      await drainer.shutdown();
    }
  });

  it('refuses bad arguments and unknown targets and ids', async () => {
    expect(await rejection(sender.selfCheck('jb_prices', 'every' as 'full'))).toMatchObject({
      code: 'validation',
    });
    expect(await rejection(sender.selfCheck('jb_prices', 'sample', { sample: 0 }))).toMatchObject({
      code: 'validation',
    });
    expect(await rejection(sender.selfCheck('jb_prices', 'full', { sample: 5 }))).toMatchObject({
      code: 'validation',
    });
    expect(
      await rejection(sender.selfCheck('jb_prices', 'full', { maxFindings: 1.5 })),
    ).toMatchObject({ code: 'validation' });
    expect(await rejection(sender.selfCheck('jb_nothing', 'full'))).toMatchObject({
      code: 'not_found',
    });
    expect(await rejection(sender.selfCheckJob('not-an-id'))).toMatchObject({ code: 'validation' });
    expect(await sender.selfCheckJob('00000000-0000-4000-8000-000000000000')).toBeNull();
  });

  it('keeps the jobs of two instances in one database apart', async () => {
    const other = await migratedTrellis(db, {
      schema: 'Other Trellis',
      targetSchema: 'other_targets',
      staging: true,
      drainThreads: 1,
      applicationName: 'jb-other',
    });
    try {
      const [row] = await db.sql<{ schemas: string[] }[]>`
        SELECT array_agg(nspname::text ORDER BY nspname) AS schemas FROM pg_namespace
         WHERE nspname LIKE 'trellis_jobs%'`;
      expect(row?.schemas).toHaveLength(2);
      expect(row?.schemas).toContain('trellis_jobs');
      expect(row?.schemas.find((s) => s !== 'trellis_jobs')).toMatch(/^trellis_jobs_[0-9a-f]{16}$/);
      // The other instance's worker never takes this instance's job.
      await staging.apply(
        transformStatement({ target: 'jb_apart', from: 'jb_items', select: 'price' }),
      );
      const job = await sender.selfCheck('jb_apart', 'full');
      // Bounded by what must come after: the other instance's worker takes and finishes a
      // job of its own queued after this one.
      await db.sql`CREATE SCHEMA IF NOT EXISTS other_targets`;
      await other.apply(
        transformStatement({ target: 'jb_theirs', from: 'jb_items', select: 'price' }),
      );
      await waitForStatus(other, 'jb_theirs', 'live');
      const theirs = await other.selfCheck('jb_theirs', 'full');
      expect((await finishedJob(other, theirs.id)).state).toBe('done');
      expect((await sender.selfCheckJob(job.id))?.state).toBe('queued');
    } finally {
      await other.shutdown();
    }
  });
});
