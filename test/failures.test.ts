import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { TEST_CAPTURE } from './support/capture-mode.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// Failures no row explains (issue #9 item 8): a page that keeps failing is retried with
// backoff and reported (drainFailure); a build that keeps failing is retried, reported
// (buildFailure), and pauses after five attempts. Both made to happen here by revoking a
// privilege from the role the engine runs as, and cleared by granting it back.

let db: TestDatabase;
let owner: TestDatabase;
let trellis: Trellis;

beforeAll(async () => {
  db = await freshDatabase();
  const role = `f_owner_${process.pid}`;
  await db.sql.unsafe(`
    DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '${role}') THEN
        CREATE ROLE ${role} LOGIN ${TEST_CAPTURE === 'logical' ? 'REPLICATION' : ''};
      END IF;
    END $$;
    GRANT CREATE ON DATABASE "${db.name}" TO ${role};
    GRANT ALL ON SCHEMA public TO ${role};`);
  const url = new URL(db.url);
  url.username = role;
  owner = { name: db.name, url: url.toString(), sql: sqlClient(url.toString()) };
  await owner.sql.unsafe(`
    CREATE TABLE f_src (id int PRIMARY KEY, v int NOT NULL);
    INSERT INTO f_src SELECT i, i FROM generate_series(1, 300) i;`);
  trellis = await migratedTrellis(owner, { staging: true, drainThreads: 1 });
});
afterAll(async () => {
  await trellis?.shutdown();
  await owner?.sql.end({ timeout: 2 });
});

describe('failures no row explains', () => {
  it('a page that keeps failing is reported as drainFailure, and cleared once it goes through', async () => {
    const d: Definition = { target: 'f_drained', from: 'f_src', select: 'v', implicit: 'id' };
    await trellis.apply(transformStatement(d));
    await waitForStatus(trellis, d.target, 'live');
    await owner.sql.unsafe(`REVOKE INSERT, UPDATE ON ${d.target} FROM CURRENT_USER`);
    await owner.sql`INSERT INTO f_src VALUES (1001, 1)`;
    await waitFor(
      async () => ((await trellis.status(d.target)).drainFailure?.attempts ?? 0) >= 2,
      'the page to fail twice',
    );
    const failure = (await trellis.status(d.target)).drainFailure!;
    expect(failure).toMatchObject({ tables: ['public.f_src'], sqlstate: '42501' });
    expect(failure.error).toContain('permission denied');
    expect(failure.since.getTime()).toBeLessThanOrEqual(failure.lastSeen.getTime());
    // Retried with backoff, never spinning: two attempts are at least half a second apart.
    expect(failure.lastSeen.getTime() - failure.since.getTime()).toBeGreaterThanOrEqual(400);
    expect((await trellis.status(d.target)).heldKeys).toBe(0);
    await owner.sql.unsafe(`GRANT INSERT, UPDATE ON ${d.target} TO CURRENT_USER`);
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 20_000 });
    expect((await trellis.status(d.target)).drainFailure).toBeNull();
    await expectMatchesDefinition(db.sql, d);
  });

  it('a build that keeps failing reports buildFailure, pauses after five attempts, and resumes once fixed', async () => {
    await owner.sql.unsafe('REVOKE SELECT ON f_src FROM CURRENT_USER');
    const d: Definition = {
      target: 'f_built',
      from: 'f_src',
      select: 'v * 2 AS doubled',
      implicit: 'id',
    };
    // Defining checks the statement (which needs no SELECT privilege on the rows); the build
    // reads the rows, and fails.
    await trellis.apply(transformStatement(d));
    await waitFor(
      async () => (await trellis.status(d.target)).buildFailure !== null,
      'the build to fail',
      20_000,
    );
    const first = (await trellis.status(d.target)).buildFailure!;
    expect(first.error).toContain('permission denied');
    expect(first.nextAttemptAt).toBeInstanceOf(Date);
    await waitFor(
      async () => (await trellis.status(d.target)).status === 'paused',
      'the build to pause after five attempts',
      30_000,
    );
    const paused = await trellis.status(d.target);
    expect(paused.pauseReason).toBe('build_failure');
    expect(paused.buildFailure?.attempts).toBe(5);
    await owner.sql.unsafe('GRANT SELECT ON f_src TO CURRENT_USER');
    await trellis.apply(`RESUME TRANSFORM ${d.target}`);
    await waitForStatus(trellis, d.target, 'live');
    expect((await trellis.status(d.target)).buildFailure).toBeNull();
    await expectMatchesDefinition(db.sql, d);
  });
});
