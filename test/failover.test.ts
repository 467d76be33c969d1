import { afterAll, describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { startPostgres, type TestPostgres } from '../src/testing/index.js';
import { sqlClient } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { type Standby, startStandby } from './support/standby.js';
import { quietLogger, waitFor, waitForStatus } from './support/trellis.js';

// A failover onto a promoted standby (issue #21 items 3 and 6; ADR 0035, ADR 0036): a
// streaming standby (pg_basebackup -R) of a cluster with live transforms. Workers pointed
// at it before the promotion find read-only sessions and say so; once it is promoted they
// recover on their own. Under trigger capture it is the same database (not a restore):
// the ledger came through replication, and every target converges with nothing paused.
// Under WAL capture the slot did not come (Postgres 15 keeps no slot on a standby): its
// readers stop, saying the slot does not exist on this server.

const items: Definition = {
  target: 'fo_sizes',
  from: 'fo_items',
  select: 'size',
  where: 'size % 3 <> 0',
  implicit: 'id',
};
const groups: Definition = {
  target: 'fo_groups',
  from: 'fo_items',
  select: 'size % 5 AS bucket, count(*) AS n',
  groupBy: 'size % 5',
};

let primary: TestPostgres | undefined;
const clients: Array<{ end(options: { timeout: number }): Promise<void> }> = [];
let standby: Standby | undefined;
const handles: Trellis[] = [];

afterAll(async () => {
  for (const h of handles.splice(0)) await h.shutdown().catch(() => undefined);
  for (const c of clients.splice(0)) await c.end({ timeout: 2 });
  await standby?.stop();
  await primary?.stop();
});

async function live(url: string, capture: 'trigger' | 'logical'): Promise<void> {
  const migrator = await Trellis.connect({ url, logger: quietLogger });
  await migrator.migrate();
  await migrator.shutdown();
  const sql = sqlClient(url);
  await sql.unsafe(`
    CREATE TABLE fo_items (id int PRIMARY KEY, size int NOT NULL);
    INSERT INTO fo_items SELECT g, g FROM generate_series(1, 300) g;`);
  const worker = await Trellis.connect({
    url,
    logger: quietLogger,
    staging: true,
    drainThreads: 2,
    capture,
  });
  try {
    for (const d of [items, groups]) await worker.define(transformStatement(d));
    for (const d of [items, groups]) await waitForStatus(worker, d.target, 'live', 60_000);
    if (capture === 'logical') {
      await waitFor(
        async () => (await worker.status(items.target)).capture.sources[0]?.mode === 'logical',
        'the source moved to WAL capture',
        60_000,
      );
    }
    await sql.unsafe('UPDATE fo_items SET size = size + 1 WHERE id <= 40');
  } finally {
    await worker.shutdown();
  }
  // Captured with no worker running: in the ledger (or the WAL) when the failover comes.
  await sql.unsafe(`
    UPDATE fo_items SET size = size * 2 WHERE id % 7 = 0;
    DELETE FROM fo_items WHERE id % 13 = 0;
    INSERT INTO fo_items VALUES (1001, 1001);`);
  await sql.end({ timeout: 2 });
}

describe('a failover onto a promoted standby', () => {
  it('carries trigger capture over, says a slot does not exist on this server, and recovers read-only workers on promotion', async () => {
    primary = await startPostgres({
      kind: 'path',
      settings: { wal_level: 'logical', max_wal_senders: 10, max_replication_slots: 10 },
    });
    const triggers = await primary.createDatabase({ name: 'fo_triggers' });
    const wal = await primary.createDatabase({ name: 'fo_wal' });
    standby = await startStandby(primary);
    await live(triggers.url, 'trigger');
    await live(wal.url, 'logical');
    // The standby has replayed everything the primary wrote.
    const [{ lsn } = { lsn: '' }] = await primary.adminQuery<{ lsn: string }>(
      'SELECT pg_current_wal_lsn()::text AS lsn',
    );
    const onStandby = sqlClient(standby.url('fo_triggers'), { max: 1 });
    clients.push(onStandby);
    await waitFor(async () => {
      const [row] = await onStandby.unsafe(
        'SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn AS caught_up',
        [lsn],
      );
      return row?.caught_up === true;
    }, 'the standby replaying the primary');

    // Workers pointed at the standby before the promotion: read-only sessions, refused and
    // said so (in their log: a standby cannot record their health in the catalog).
    const refusals: string[] = [];
    const worker = await Trellis.connect({
      url: standby.url('fo_triggers'),
      logger: {
        ...quietLogger,
        warn(obj: Record<string, unknown>, msg: string) {
          if (obj.code === 'read_only') refusals.push(msg);
          quietLogger.warn(obj, msg);
        },
      },
      staging: true,
      drainThreads: 2,
    });
    handles.push(worker);
    const calls = await Trellis.connect({ url: standby.url('fo_triggers'), logger: quietLogger });
    handles.push(calls);
    await waitFor(
      async () => refusals.some((m) => m.startsWith('staging worker')),
      'the staging worker refusing a standby session',
    );
    expect(refusals.find((m) => m.startsWith('staging worker'))).toContain(
      'the server is a standby',
    );

    // The primary is lost; the standby is promoted.
    await primary.stop();
    primary = undefined;
    await standby.promote();

    // Trigger capture: the same database, not a restore; the ledger came along.
    for (const d of [items, groups]) {
      await calls.awaitConverged(d.target, await calls.watermarkToken(), { timeoutMs: 60_000 });
      const status = await waitForStatus(calls, d.target, 'live');
      expect(status.pauseReason).toBeNull();
      expect(status.restored).toBeNull();
      await expectMatchesDefinition(onStandby, d);
    }
    await onStandby.unsafe('UPDATE fo_items SET size = size + 3 WHERE id <= 100');
    const token = await calls.watermarkToken();
    for (const d of [items, groups]) {
      await calls.awaitConverged(d.target, token, { timeoutMs: 30_000 });
      await expectMatchesDefinition(onStandby, d);
    }

    // WAL capture: the slot stayed on the lost primary.
    const walWorker = await Trellis.connect({
      url: standby.url('fo_wal'),
      logger: quietLogger,
      staging: true,
      drainThreads: 1,
    });
    handles.push(walWorker);
    const stopped = await waitForStatus(walWorker, items.target, 'paused', 60_000);
    expect(stopped.captureFailure?.error).toMatch(
      /replication slot .* does not exist on this server \(a promoted standby or a restored backup\?\)/,
    );
  }, 300_000);
});
