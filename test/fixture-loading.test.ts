import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import type postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { findPgDump } from '../src/migration/dump/find-pg-dump.js';
import { resumeCaptureDisruptions } from '../src/testing/index.js';
import { skipUnlessCi } from './support/ci.js';
import { freshDatabase, serverInfo, type TestDatabase } from './support/database.js';
import { waitForStatus } from './support/trellis.js';

// The README's example of a suite that loads fixtures with triggers disabled (issue #9):
// a loader that disables triggers disables Trellis's capture too; Trellis stops the
// transforms reading those tables rather than let a test read wrong data, and
// resumeCaptureDisruptions() rebuilds them before the tests run. This file is that
// example, run as CI runs the suite.

const run = promisify(execFile);
let db: TestDatabase;
let trellis: Trellis;
let sql: postgres.Sql;

beforeAll(async () => {
  db = await freshDatabase();
  {
    await using migrator = await Trellis.connect({ url: db.url, logger: quiet });
    await migrator.migrate();
  }
  // Fixtures loaded with triggers disabled disrupt trigger capture, which this file is about
  // (under WAL capture, triggers play no part: nothing is disrupted).
  trellis = await Trellis.connect({
    url: db.url,
    staging: true,
    drainThreads: 1,
    logger: quiet,
    capture: 'trigger',
  });
  sql = db.sql;
  await sql.unsafe(`
    CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
    CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, amount numeric NOT NULL);`);
  await trellis.apply(
    'TRANSFORM customer_totals FROM orders o JOIN customers c ON c.id = o.customer_id SELECT c.name AS name, sum(o.amount) AS total GROUP BY c.name',
  );
  // The suite's global setup: transforms defined and live (capture installed) before any
  // fixture is loaded.
  await waitForStatus(trellis, 'customer_totals', 'live');
});
afterAll(async () => {
  await trellis?.shutdown();
});

const quiet = { debug() {}, info() {}, warn() {}, error() {} };

async function totals(): Promise<Record<string, string>> {
  const rows = await sql<
    { name: string; total: string }[]
  >`SELECT name, total FROM customer_totals`;
  return Object.fromEntries(rows.map((r) => [r.name, r.total]));
}

describe('fixtures loaded with triggers disabled', () => {
  it('ALTER TABLE … DISABLE TRIGGER ALL, then resumeCaptureDisruptions()', async () => {
    // A fixture loader, as many suites have one: triggers off for the load (so foreign
    // keys and audit triggers stay out of the way), on again afterwards.
    await sql.begin(async (tx) => {
      for (const table of ['customers', 'orders']) {
        await tx.unsafe(`ALTER TABLE ${table} DISABLE TRIGGER ALL`);
      }
      await tx`INSERT INTO customers VALUES (1, 'ada'), (2, 'grace')`;
      await tx`INSERT INTO orders VALUES (1, 1, 10), (2, 1, 5), (3, 2, 7)`;
      for (const table of ['customers', 'orders']) {
        await tx.unsafe(`ALTER TABLE ${table} ENABLE TRIGGER ALL`);
      }
    });
    // Before the tests: the transforms reading those tables are rebuilt, and caught up.
    expect(await resumeCaptureDisruptions(trellis)).toEqual(['customer_totals']);
    expect(await totals()).toEqual({ ada: '15', grace: '7' });
  });

  it('pg_restore --disable-triggers, then resumeCaptureDisruptions()', async (context) => {
    // pg_dump refuses a server newer than itself: the one for this server (CI's Postgres 18
    // run names scripts/fetch-pg-client.mjs's in TRELLIS_PG_DUMP), and the pg_restore beside it.
    const serverMajor = Math.floor(serverInfo().serverVersion / 10_000);
    const pgDump = process.env.TRELLIS_PG_DUMP
      ? await findPgDump(serverMajor, process.env.TRELLIS_PG_DUMP)
      : await findPgDump(serverMajor).catch(() => undefined);
    if (!pgDump)
      skipUnlessCi(context, `no pg_dump for Postgres ${serverMajor} (see test/dump.test.ts)`);
    const beside = join(dirname(pgDump.path), 'pg_restore');
    const pgRestore = pgDump.path.includes('/') && existsSync(beside) ? beside : 'pg_restore';
    const dir = await mkdtemp(join(tmpdir(), 'trellis-fixture-'));
    const archive = join(dir, 'fixtures.dump');
    try {
      // The fixtures: another database's rows, dumped as data only.
      const source = await freshDatabase();
      await source.sql.unsafe(`
        CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
        CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, amount numeric NOT NULL);
        INSERT INTO customers VALUES (3, 'edsger');
        INSERT INTO orders VALUES (10, 3, 100), (11, 3, 1);`);
      await run(pgDump.path, ['--data-only', '--format=custom', `--file=${archive}`, source.url]);
      await run(pgRestore, ['--data-only', '--disable-triggers', `--dbname=${db.url}`, archive]);
      expect(await resumeCaptureDisruptions(trellis)).toEqual(['customer_totals']);
      expect(await totals()).toEqual({ ada: '15', grace: '7', edsger: '101' });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
