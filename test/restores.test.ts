import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { findPgDump } from '../src/migration/dump/find-pg-dump.js';
import { startPostgres, type TestPostgres } from '../src/testing/index.js';
import { IN_CI } from './support/ci.js';
import { freshDatabase, serverInfo, sqlClient } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, quietLogger, rejection, waitForStatus } from './support/trellis.js';

// A database restored from a logical dump (issue #21 item 3, ADR 0035): pg_dump -Fc and
// pg_restore into a new database of the same cluster, and of another cluster. The catalog
// comes with the other database's table OIDs and transaction ids: until the staging
// worker has rebound the tables by name and rebuilt every target, status() says
// `unverified` and awaitConverged does not resolve; then every target is live, equal to
// its definition, and follows writes, with nothing paused and no RESUME.

const run = promisify(execFile);

// pg_dump refuses a server newer than itself, and a dump restores into its own major: the
// client tools of the suite's server (TRELLIS_PG_DUMP names them where the machine has
// none, as for the dump tests, ADR 0030), and a second cluster of the same kind.
const pg = inject('pg');
const serverMajor = Math.floor(pg.serverVersion / 10_000);
const pgDump = process.env.TRELLIS_PG_DUMP
  ? await findPgDump(serverMajor, process.env.TRELLIS_PG_DUMP)
  : await findPgDump(serverMajor).catch(() => undefined);
if (!pgDump && IN_CI) {
  throw new Error(
    `the restore tests need a pg_dump for Postgres ${serverMajor} under CI: run \`node scripts/fetch-pg-client.mjs --major ${serverMajor}\` and set TRELLIS_PG_DUMP=<the directory it prints>/pg_dump`,
  );
}
if (!pgDump) {
  console.log(
    `[skip] restore tests: no pg_dump for Postgres ${serverMajor} (see test/dump.test.ts)`,
  );
}
const pgRestore =
  pgDump && existsSync(join(dirname(pgDump.path), 'pg_restore'))
    ? join(dirname(pgDump.path), 'pg_restore')
    : 'pg_restore';

const paid: Definition = {
  target: 'rs_paid',
  from: 'rs_orders',
  select: 'customer, amount',
  where: "status = 'paid'",
  implicit: 'id',
};
const totals: Definition = {
  target: 'rs_totals',
  from: 'rs_orders',
  select: 'customer, count(*) AS n, sum(amount) AS total',
  groupBy: 'customer',
};
const regions: Definition = {
  target: 'rs_regions',
  from: 'rs_orders o JOIN rs_customers c ON c.id = o.customer',
  select: 'o.amount, c.region',
  implicit: 'o.id AS id, c.id AS c_id',
};
// A chain: its source is another transform's target.
const regionTotals: Definition = {
  target: 'rs_region_totals',
  from: 'rs_regions',
  select: 'region, sum(amount) AS total',
  groupBy: 'region',
};
const definitions = [paid, totals, regions, regionTotals];

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A database with live transforms, and writes still in the ledger: dumped with pg_dump -Fc. */
async function dumpOfLiveInstance(): Promise<string> {
  const db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE rs_customers (id int PRIMARY KEY, region text NOT NULL);
    CREATE TABLE rs_orders (id int PRIMARY KEY, customer int NOT NULL, amount int NOT NULL,
                            status text NOT NULL);
    INSERT INTO rs_customers SELECT g, 'r' || (g % 3) FROM generate_series(1, 20) g;
    INSERT INTO rs_orders SELECT g, 1 + g % 20, g, CASE WHEN g % 2 = 0 THEN 'paid' ELSE 'open' END
      FROM generate_series(1, 400) g;`);
  const trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
  try {
    for (const d of definitions) await trellis.define(transformStatement(d));
    for (const d of definitions) await waitForStatus(trellis, d.target, 'live', 60_000);
  } finally {
    await trellis.shutdown();
  }
  // Written with no worker running: captured, in the ledger, in the dump.
  await db.sql.unsafe(`
    UPDATE rs_orders SET status = 'paid' WHERE id % 5 = 0;
    DELETE FROM rs_orders WHERE id % 11 = 0;
    UPDATE rs_customers SET region = 'moved' WHERE id = 3;`);
  const dir = await mkdtemp(join(tmpdir(), 'trellis-dump-'));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'app.dump');
  await run(pgDump?.path ?? 'pg_dump', ['-Fc', '-f', file, '-d', db.url]);
  return file;
}

/** pg_restore into a new, empty database on the server at `adminUrl`; its URL. */
async function restoreInto(adminUrl: string, file: string, name: string): Promise<string> {
  const admin = sqlClient(adminUrl, { max: 1 });
  await admin.unsafe(`CREATE DATABASE "${name}" TEMPLATE template0`);
  cleanups.push(async () => {
    await admin.unsafe(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
    await admin.end({ timeout: 2 });
  });
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  await run(pgRestore, ['--exit-on-error', '-d', url.toString(), file]);
  return url.toString();
}

/** What a restored database does: unverified, then rebound, rebuilt, live and following writes. */
async function expectBroughtBack(
  url: string,
  reason: RegExp = /restored or (cloned|copied)/,
): Promise<void> {
  const sql = sqlClient(url);
  // A handle without workers (a deploy's web process) before any staging worker ran.
  const calls = await Trellis.connect({ url, logger: quietLogger });
  try {
    for (const d of definitions) {
      const before = await calls.status(d.target);
      expect(before.status, d.target).toBe('unverified');
      expect(before.restored?.reason).toMatch(reason);
      expect(before.restored?.detectedAt).toBeNull();
      expect(before.waitingOn?.kind).toBe('staging_worker');
    }
    const token = await calls.watermarkToken();
    const waited = await rejection(calls.awaitConverged(paid.target, token, { timeoutMs: 300 }));
    expect(waited.code).toBe('timeout');

    const worker = await Trellis.connect({
      url,
      logger: quietLogger,
      staging: true,
      drainThreads: 2,
    });
    try {
      for (const d of definitions) {
        await calls
          .awaitConverged(d.target, await calls.watermarkToken(), { timeoutMs: 60_000 })
          .catch(async (error: unknown) => {
            const s = await calls.status(d.target);
            throw new Error(
              `${String(error)}; status: ${JSON.stringify({ ...s, workers: undefined })}`,
            );
          });
        const after = await waitForStatus(calls, d.target, 'live');
        expect(after.pauseReason).toBeNull();
        expect(after.captureFailure).toBeNull();
        expect(after.restored?.detectedAt).toBeInstanceOf(Date);
        await expectMatchesDefinition(sql, d);
      }
      // Capture carries on in the restored database.
      await sql.unsafe(`
        INSERT INTO rs_orders VALUES (1001, 4, 1001, 'paid'), (1002, 7, 5, 'open');
        UPDATE rs_orders SET amount = amount * 2 WHERE id % 3 = 0;
        UPDATE rs_customers SET region = 'r9' WHERE id = 4;`);
      const token2 = await calls.watermarkToken();
      for (const d of definitions) {
        await calls.awaitConverged(d.target, token2, { timeoutMs: 30_000 });
        await expectMatchesDefinition(sql, d);
      }
      const [paused] = await sql.unsafe(
        `SELECT count(*)::int AS n FROM trellis.transforms WHERE paused_at IS NOT NULL`,
      );
      expect(paused?.n).toBe(0);
    } finally {
      await worker.shutdown();
    }
  } finally {
    await calls.shutdown();
    await sql.end({ timeout: 2 });
  }
}

describe.skipIf(!pgDump)('a database restored from pg_dump', () => {
  let dump: string;

  it('is brought back in a new database of the same cluster', async () => {
    dump = await dumpOfLiveInstance();
    const url = await restoreInto(serverInfo().adminUrl, dump, `rs_same_${process.pid}`);
    await expectBroughtBack(url);
  }, 180_000);

  it('is recognised by its tables where the system identifier cannot be read', async () => {
    dump ??= await dumpOfLiveInstance();
    const url = await restoreInto(serverInfo().adminUrl, dump, `rs_blind_${process.pid}`);
    // As recorded by a role that may not read pg_control_system(), with the database OID
    // a fresh cluster could hand out again: only the tables' OIDs tell.
    const sql = sqlClient(url, { max: 1 });
    await sql.unsafe(`UPDATE trellis.config
                         SET database_identity = jsonb_set(trellis._database_identity(),
                                                           '{systemIdentifier}', 'null')`);
    await sql.end({ timeout: 2 });
    await expectBroughtBack(url, /no table Trellis made has the OID it recorded/);
  }, 180_000);

  it('is brought back in another cluster', async () => {
    dump ??= await dumpOfLiveInstance();
    const other: TestPostgres = await startPostgres({
      kind: pg.kind === 'embedded' ? 'embedded' : 'path',
      // As the suite's server (test/support/global-setup.ts): WAL capture needs a slot.
      settings: { wal_level: 'logical', max_replication_slots: 10, max_wal_senders: 10 },
    });
    cleanups.push(() => other.stop());
    const url = await restoreInto(other.adminUrl, dump, `rs_other_${process.pid}`);
    await expectBroughtBack(url);
  }, 180_000);
});
