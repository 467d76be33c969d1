import { readFileSync } from 'node:fs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { latestVersion } from '../src/engine/schema/install-sql.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { scrape } from './support/prometheus.js';
import { migratedTrellis, rejection, waitFor, waitForStatus } from './support/trellis.js';

// A stopped pipeline says so (issue #21 item 7, issue #23 item 1; ADR 0038): status()
// carries the workers' health and what stops the pipeline while the lifecycle still says
// `live`; a transform waiting to be built says what it waits on; every process running
// workers is in the catalog with its trellis-pg and schema versions, and stops its
// workers when the schema changes under it into one it cannot run on.

const PACKAGE_VERSION = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
    version: string;
  }
).version;

let db: TestDatabase;
const handles: Trellis[] = [];

async function handle(
  options: { staging?: boolean; drainThreads?: number; applicationName?: string } = {},
): Promise<Trellis> {
  const h = await migratedTrellis(db, options);
  handles.push(h);
  return h;
}

async function shutdown(h: Trellis): Promise<void> {
  handles.splice(handles.indexOf(h), 1);
  await h.shutdown();
}

// A database per test: each looks at the processes and workers of its instance alone.
beforeEach(async () => {
  db = await freshDatabase();
});

afterEach(async () => {
  for (const h of handles.splice(0)) await h.shutdown();
  await db.sql.unsafe(`ALTER DATABASE "${db.name}" RESET default_transaction_read_only`);
});

describe('worker health', () => {
  it('says what a transform waits on: no staging worker, then no drain loop', async () => {
    await db.sql.unsafe(`
      CREATE TABLE wh_items (id int PRIMARY KEY, size int NOT NULL);
      INSERT INTO wh_items SELECT g, g FROM generate_series(1, 500) g;`);
    const items: Definition = {
      target: 'wh_sizes',
      from: 'wh_items',
      select: 'size',
      implicit: 'id',
    };
    // A deploy's migration step defines it; no process runs workers yet.
    const calls = await handle();
    await calls.define(transformStatement(items));
    const waiting = await calls.status('wh_sizes');
    expect(waiting.status).toBe('waiting_to_backfill');
    expect(waiting.captureWait).toBeNull();
    expect(waiting.waitingOn?.kind).toBe('staging_worker');
    expect(waiting.waitingOn?.reason).toContain('no staging worker is running');
    expect(waiting.waitingOn?.reason).toContain('staging: true');
    expect(waiting.workerFailure).toMatchObject({ role: 'staging' });
    expect(waiting.workers.staging).toMatchObject({ elected: false, passing: false });
    expect(waiting.workers.drain).toMatchObject({ loops: 0, passing: false });

    // A staging worker builds nothing alone: the build waits for a drain loop.
    const staging = await handle({ staging: true });
    const building = await waitForStatus(calls, 'wh_sizes', 'backfilling');
    expect(building.waitingOn?.kind).toBe('drain_worker');
    expect(building.waitingOn?.reason).toContain('no drain loop is running');
    expect(building.workerFailure).toMatchObject({ role: 'drain' });
    await waitFor(
      async () => (await calls.workers()).staging.passing === true,
      'the staging worker elected and reporting',
    );

    const drains = await handle({ drainThreads: 2 });
    const live = await waitForStatus(calls, 'wh_sizes', 'live');
    await waitFor(async () => {
      const s = await calls.status('wh_sizes');
      return (
        s.workerFailure === null &&
        s.workers.drain.passing === true &&
        s.workers.drain.lastPassAt !== null
      );
    }, 'the drain loops reporting their passes');
    expect(live.waitingOn).toBeNull();
    const now = await calls.status('wh_sizes');
    expect(now.workers.staging.process?.pid).toBe(process.pid);
    expect(now.workers.drain.loops).toBe(2);
    expect(now.workers.drain.lastPassAt).toBeInstanceOf(Date);
    await expectMatchesDefinition(db.sql, items);
    await shutdown(drains);
    await shutdown(staging);
  });

  it('says the pipeline stopped when every worker fails, while status stays live', async () => {
    await db.sql.unsafe(`
      CREATE TABLE wh_orders (id int PRIMARY KEY, amount int NOT NULL);
      INSERT INTO wh_orders SELECT g, g FROM generate_series(1, 100) g;`);
    const orders: Definition = {
      target: 'wh_amounts',
      from: 'wh_orders',
      select: 'amount',
      implicit: 'id',
    };
    const app = `trellis-test-health-${process.pid}`;
    const worker = await handle({ staging: true, drainThreads: 2, applicationName: app });
    await worker.define(transformStatement(orders));
    await waitForStatus(worker, 'wh_amounts', 'live');
    await waitFor(
      async () => (await worker.status('wh_amounts')).workerFailure === null,
      'healthy',
    );

    // Every new session of the database is read-only (a failover onto a standby looks the
    // same to the workers); the workers' sessions are cut, and come back read-only.
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET default_transaction_read_only = on`);
    try {
      await db.sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                    WHERE application_name = ${`${app}:worker`}`;
      await db.sql.begin('read write', (tx) =>
        tx.unsafe('UPDATE wh_orders SET amount = amount + 1 WHERE id <= 10'),
      );
      await waitFor(
        async () => (await worker.status('wh_amounts')).workerFailure?.sqlstate === '25006',
        'the staging worker reported failing',
        30_000,
      );
      const stopped = await worker.status('wh_amounts');
      // The lifecycle is the catalog's, and still says live: the failure says the rest.
      expect(stopped.status).toBe('live');
      // A read-only session is refused before it takes the lock that elects the worker
      // (ADR 0036): nobody is elected, and the failure says why.
      expect(stopped.workerFailure?.error).toContain('the staging worker');
      expect(stopped.workerFailure?.error).toContain('fails');
      expect(stopped.workerFailure?.error).toContain('read-only');
      expect(stopped.workerFailure?.sqlstate).toBe('25006');
      expect(stopped.workerFailure?.since).toBeInstanceOf(Date);
      expect(stopped.workers.staging).toMatchObject({ elected: false, passing: false });
      expect(stopped.workers.staging.lastError?.sqlstate).toBe('25006');
      const table = await worker.workers();
      expect(table.staging.problem).toContain('read-only');
    } finally {
      await db.sql.unsafe(`ALTER DATABASE "${db.name}" RESET default_transaction_read_only`);
    }
    await db.sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE application_name = ${`${app}:worker`}`;
    let last: unknown;
    await waitFor(
      async () => {
        last = (await worker.status('wh_amounts')).workerFailure;
        return last === null;
      },
      'the workers passing again',
      30_000,
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}; the last workerFailure: ${JSON.stringify(last)}`);
    });
    await worker.awaitConverged('wh_amounts', await worker.watermarkToken(), { timeoutMs: 30_000 });
    await expectMatchesDefinition(db.sql, orders);
    await shutdown(worker);
  });

  it('records every process with its versions, and stops workers on a schema they cannot run on', async () => {
    const worker = await handle({ staging: true, drainThreads: 1 });
    const before = await worker.workers();
    expect(before.schemaVersion).toBe(latestVersion());
    expect(before.processes).toHaveLength(1);
    const mine = before.processes[0];
    expect(mine).toMatchObject({
      packageVersion: PACKAGE_VERSION,
      schemaVersion: latestVersion(),
      drainLoops: 1,
      stale: false,
      refused: null,
    });
    const instance = `${db.name}/trellis`;
    const metrics = await scrape();
    expect(
      metrics.value('trellis_build_info', {
        trellis_instance: instance,
        version: PACKAGE_VERSION,
        schema_version: String(latestVersion()),
      }),
    ).toBe(1);
    expect(metrics.value('trellis_schema_version', { trellis_instance: instance })).toBe(
      latestVersion(),
    );
    expect(
      metrics.value('trellis_worker_failing', { trellis_instance: instance, role: 'staging' }),
    ).toBe(0);

    // A newer trellis-pg migrated the schema (its version rows, as its migrate() leaves
    // them): this process is now older than the schema, and says so, and runs on.
    const additive = latestVersion() + 1;
    await db.sql`INSERT INTO trellis.migrations (version, name, breaking)
                 VALUES (${additive}, 'from_a_newer_trellis', false)`;
    const newer = await worker.workers();
    expect(newer.schemaVersion).toBe(additive);
    expect(newer.processes.find((p) => p.id === mine?.id)?.schemaVersion).toBe(latestVersion());
    // A scrape reads the catalog's figures from a snapshot at most a few seconds old.
    await waitFor(
      async () =>
        (await scrape()).value('trellis_schema_version', { trellis_instance: instance }) ===
        additive,
      'the installed schema version in the metrics',
    );
    expect(await worker.hasLiveStagingWorker()).toBe(true);

    // A breaking one: its workers stop within a heartbeat, and its row says why.
    const breaking = latestVersion() + 2;
    await db.sql`INSERT INTO trellis.migrations (version, name, breaking)
                 VALUES (${breaking}, 'breaking_from_a_newer_trellis', true)`;
    try {
      await waitFor(
        async () => {
          const [row] = await db.sql<{ refused: string | null }[]>`
            SELECT health -> 'refused' ->> 'message' AS refused
              FROM trellis.processes WHERE id = ${mine!.id}`;
          return row?.refused != null;
        },
        'the process refusing the schema',
        30_000,
      );
      const [row] = await db.sql<{ refused: string }[]>`
        SELECT health -> 'refused' ->> 'message' AS refused FROM trellis.processes
         WHERE id = ${mine!.id}`;
      expect(row?.refused).toContain(`breaking version ${breaking}`);
      await waitFor(
        async () => !(await worker.hasLiveStagingWorker()) && !(await worker.hasLiveDrainWorkers()),
        'its workers stopped',
      );
      const refused = await rejection(worker.status('wh_sizes'));
      expect(refused.code).toBe('incompatible_schema');
    } finally {
      await db.sql`DELETE FROM trellis.migrations WHERE version IN (${additive}, ${breaking})`;
    }
    await shutdown(worker);
    const after = await (await handle()).workers();
    expect(after.processes.find((p) => p.id === mine?.id)).toBeUndefined();
  });
});
