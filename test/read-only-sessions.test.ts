import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import {
  migratedTrellis,
  quietLogger,
  rejection,
  waitFor,
  waitForStatus,
} from './support/trellis.js';

// Read-only sessions (issue #21 item 6, ADR 0036): a database whose default turns
// read-only for a while (or a failover onto a standby) gives the engine sessions that
// cannot write. Each is refused when it opens and never reused; status() says so; once the
// setting is reset the workers recover on fresh sessions, with no restart of the app.

let db: TestDatabase;
const handles: Trellis[] = [];

beforeEach(async () => {
  db = await freshDatabase();
});

afterEach(async () => {
  for (const h of handles.splice(0)) await h.shutdown();
  await db.sql.unsafe(`ALTER DATABASE "${db.name}" RESET default_transaction_read_only`);
});

describe('read-only sessions', () => {
  it('reports a read-only database in status(), and recovers on its own once it is reset', async () => {
    await db.sql.unsafe(`
      CREATE TABLE ro_orders (id int PRIMARY KEY, amount int NOT NULL);
      INSERT INTO ro_orders SELECT g, g FROM generate_series(1, 100) g;`);
    const orders: Definition = {
      target: 'ro_amounts',
      from: 'ro_orders',
      select: 'amount',
      implicit: 'id',
    };
    const app = `trellis-test-ro-${process.pid}`;
    const worker = await migratedTrellis(db, {
      staging: true,
      drainThreads: 2,
      applicationName: app,
    });
    handles.push(worker);
    await worker.define(transformStatement(orders));
    await waitForStatus(worker, 'ro_amounts', 'live');

    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET default_transaction_read_only = on`);
    // The engine's sessions are cut (as a failover would) and come back read-only.
    await db.sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE application_name = ${`${app}:worker`} AND datname = ${db.name}`;
    // The app writes on (explicitly read-write): these rows must reach the target later.
    await db.sql.begin('read write', (tx) =>
      tx.unsafe(`UPDATE ro_orders SET amount = amount + 1000 WHERE id <= 10;
                 INSERT INTO ro_orders VALUES (101, 101)`),
    );
    await waitFor(async () => {
      const s = await worker.status('ro_amounts');
      return s.workers.staging.lastError?.code === 'read_only';
    }, 'the staging worker reporting a read-only session');
    const stopped = await worker.status('ro_amounts');
    expect(stopped.workerFailure?.error).toContain('read-only');
    expect(stopped.workerFailure?.error).toContain('default_transaction_read_only');
    expect(stopped.workerFailure?.sqlstate).toBe('25006');
    expect(stopped.workers.staging.problem).toContain('read-only');
    // A write through a call on a new session says what is wrong, with a code of its own.
    const calls = await Trellis.connect({ url: db.url, logger: quietLogger });
    handles.push(calls);
    const refused = await rejection(calls.apply('PAUSE TRANSFORM ro_amounts'));
    expect(refused.code).toBe('read_only');
    expect(refused.sqlstate).toBe('25006');
    // Nothing converges meanwhile: a wait with a short timeout times out, it does not resolve.
    const token = await worker.watermarkToken();
    expect(
      (await rejection(worker.awaitConverged('ro_amounts', token, { timeoutMs: 500 }))).code,
    ).toBe('timeout');

    // Reset, and nothing else: no session is cut, no handle restarted.
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" RESET default_transaction_read_only`);
    await waitFor(
      async () => (await worker.status('ro_amounts')).workerFailure === null,
      'the workers passing again',
      30_000,
    );
    await worker.awaitConverged('ro_amounts', await worker.watermarkToken(), {
      timeoutMs: 30_000,
    });
    await expectMatchesDefinition(db.sql, orders);
    const after = await worker.status('ro_amounts');
    expect(after.status).toBe('live');
    expect(after.pauseReason).toBeNull();
  });
});
