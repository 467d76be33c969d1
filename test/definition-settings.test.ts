import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Definition as Registered, Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { checked } from './support/self-check.js';
import { migratedTrellis, rejection, waitFor, waitForStatus } from './support/trellis.js';

// Settings a definition's expressions depend on (ENGINE.md I10; issue #21, item 1):
// TimeZone, DateStyle, IntervalStyle, extra_float_digits... are recorded with each
// transform when it is defined, and every build, re-derivation and self-check runs under
// them, whatever the engine's own sessions default to later (ALTER DATABASE ... SET, a
// pool's role with another TimeZone). The oracle runs the definition as written, under the
// settings the test defined it under.

/** The settings the transforms below are defined under (none of them the server's default). */
const DEFINED_UNDER = {
  timezone: 'Pacific/Auckland',
  intervalstyle: 'postgres',
  extra_float_digits: '1',
};

/** What the database's sessions default to after the "ALTER DATABASE ... SET" of the test. */
const CHANGED_TO = {
  timezone: 'America/Los_Angeles',
  intervalstyle: 'sql_standard',
  extra_float_digits: '0',
};

// Every expression here gives another result under CHANGED_TO than under DEFINED_UNDER.
const events: Definition = {
  target: 'st_event_days',
  from: 'st_events',
  select: `at::date AS day, to_char(at, 'YYYY-MM-DD HH24:MI') AS local_time, at::text AS at_text,
           (amount::float8 / 3)::text AS third, (at - '2024-01-01'::timestamptz)::text AS since`,
  implicit: 'id',
};
const perDay: Definition = {
  target: 'st_per_day',
  from: 'st_events',
  select: `date_trunc('day', at) AS day, count(*) AS n, sum(amount) AS total`,
  groupBy: `date_trunc('day', at)`,
};

let db: TestDatabase;
let trellis: Trellis | undefined;

async function connect(): Promise<Trellis> {
  trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
  return trellis;
}

async function definitionOf(handle: Trellis, target: string): Promise<Registered> {
  const found = (await handle.definitions()).find((d) => d.target === target);
  if (!found) throw new Error(`no definition of ${target}`);
  return found;
}

async function setDatabaseDefaults(settings: Record<string, string>): Promise<void> {
  for (const [name, value] of Object.entries(settings)) {
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET ${name} = '${value}'`);
  }
}

beforeAll(async () => {
  db = await freshDatabase();
  // 40 days of events, every 2 hours and a half, so that each zone cuts the days elsewhere.
  await db.sql.unsafe(`
    CREATE TABLE st_events (id int PRIMARY KEY, at timestamptz NOT NULL, amount numeric NOT NULL);
    INSERT INTO st_events
    SELECT i, '2024-03-01 00:00:00+00'::timestamptz + i * interval '150 minutes', i % 17 + 0.5
      FROM generate_series(1, 384) i;`);
  await setDatabaseDefaults(DEFINED_UNDER);
});

afterAll(async () => {
  await trellis?.shutdown();
});

describe('settings recorded with a definition', () => {
  it('keeps deriving rows under the TimeZone, IntervalStyle and float digits a transform was defined under after the database defaults change', async () => {
    let handle = await connect();
    await handle.apply(transformStatement(events));
    await handle.apply(transformStatement(perDay));
    await waitForStatus(handle, events.target, 'live');
    await waitForStatus(handle, perDay.target, 'live');
    await expectMatchesDefinition(db.sql, events, { settings: DEFINED_UNDER });
    await expectMatchesDefinition(db.sql, perDay, { settings: DEFINED_UNDER });

    // The database's defaults change, and the app restarts: its sessions are new.
    await handle.shutdown();
    await setDatabaseDefaults(CHANGED_TO);
    handle = await connect();
    const [session] = await db.sql<{ tz: string }[]>`
      SELECT setting AS tz FROM pg_db_role_setting s, unnest(s.setconfig) setting
       WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
         AND setting LIKE 'TimeZone=%'`;
    expect(session?.tz).toBe(`TimeZone=${CHANGED_TO.timezone}`);

    // A burst small enough to be re-derived (not recomputed): a few rows among hundreds.
    await db.sql.unsafe(`
      UPDATE st_events SET amount = amount + 1 WHERE id IN (10, 200);
      UPDATE st_events SET at = at + interval '7 hours' WHERE id = 300;
      INSERT INTO st_events VALUES (1000, '2024-03-20 11:30:00+00', 7);`);
    const token = await handle.watermarkToken();
    await handle.awaitConverged(events.target, token, { timeoutMs: 25_000 });
    await handle.awaitConverged(perDay.target, token, { timeoutMs: 25_000 });
    const status = await handle.status(perDay.target);
    expect(status.status).toBe('live');
    // Applied by delta or re-derived: never a recompute, which would hide the mix.
    expect(status.lastApply?.mode).not.toBe('recompute');

    await expectMatchesDefinition(db.sql, events, { settings: DEFINED_UNDER });
    await expectMatchesDefinition(db.sql, perDay, { settings: DEFINED_UNDER });

    // A self-check from sessions under the new defaults compares with the definition as it
    // was defined: no false divergence.
    for (const target of [events.target, perDay.target]) {
      const job = await checked(handle, target);
      expect(job.report).toMatchObject({ outcome: 'consistent', divergences: [] });
    }
  });

  it('records the settings of the session that defines a transform (a migration), and shows them in definitions()', async () => {
    const handle = trellis!;
    const inMigration: Definition = {
      target: 'st_migration_days',
      from: 'st_events',
      select: `at::text AS at_text, to_char(at, 'TMMonth DD') AS month_day, at::date AS day`,
      implicit: 'id',
    };
    const migrationSettings = { timezone: 'Asia/Kolkata', datestyle: 'SQL, DMY' };
    // As a drizzle-kit migration would: the statement in a transaction whose session set
    // its own TimeZone and DateStyle.
    await db.sql.begin(async (tx) => {
      await tx.unsafe(`SET LOCAL timezone = 'Asia/Kolkata'`);
      await tx.unsafe(`SET LOCAL datestyle = 'SQL, DMY'`);
      await tx.unsafe(`SELECT trellis.apply($1)`, [transformStatement(inMigration)]);
    });
    await waitForStatus(handle, inMigration.target, 'live');
    await expectMatchesDefinition(db.sql, inMigration, { settings: migrationSettings });

    const definition = await definitionOf(handle, inMigration.target);
    expect(definition.settings).toMatchObject(migrationSettings);
    await db.sql.unsafe(`UPDATE st_events SET at = at + interval '1 minute' WHERE id = 5`);
    const token = await handle.watermarkToken();
    await handle.awaitConverged(inMigration.target, token, { timeoutMs: 25_000 });
    await expectMatchesDefinition(db.sql, inMigration, { settings: migrationSettings });
  });

  it('changes a recorded setting deliberately with ALTER TRANSFORM ... SET / RESET, and rebuilds', async () => {
    const handle = trellis!;
    const d: Definition = {
      target: 'st_altered',
      from: 'st_events',
      select: `at::date AS day, at::text AS at_text`,
      implicit: 'id',
    };
    await handle.apply(transformStatement(d));
    await waitForStatus(handle, d.target, 'live');
    await expectMatchesDefinition(db.sql, d, { settings: CHANGED_TO });

    const result = await handle.apply(
      `ALTER TRANSFORM st_altered SET (TimeZone = 'UTC', DateStyle = 'German, DMY')`,
    );
    expect(result).toEqual({ kind: 'altered', target: 'st_altered' });
    const utc = { timezone: 'UTC', datestyle: 'German, DMY' };
    await waitFor(async () => {
      const [row] = await db.sql<
        { at_text: string }[]
      >`SELECT at_text FROM st_altered WHERE id = 1`;
      return row?.at_text === '01.03.2024 02:30:00 UTC';
    }, 'the target rebuilt under UTC');
    await waitForStatus(handle, d.target, 'live');
    await expectMatchesDefinition(db.sql, d, { settings: utc });
    const altered = await definitionOf(handle, d.target);
    expect(altered.settings).toMatchObject({ timezone: 'UTC', datestyle: 'German, DMY' });
    expect(altered.statement).toBe(
      'TRANSFORM st_altered FROM public.st_events SELECT at::date AS day, at::text AS at_text',
    );

    // RESET takes the value in force in the session that runs it.
    await db.sql.begin(async (tx) => {
      await tx.unsafe(`SET LOCAL datestyle = 'ISO, DMY'`);
      await tx.unsafe(`SELECT trellis.apply('ALTER TRANSFORM st_altered RESET (datestyle)')`);
    });
    const reset = await definitionOf(handle, d.target);
    expect(reset.settings).toMatchObject({ timezone: 'UTC', datestyle: 'ISO, DMY' });
    await waitFor(async () => {
      const [row] = await db.sql<
        { at_text: string }[]
      >`SELECT at_text FROM st_altered WHERE id = 1`;
      return row?.at_text === '2024-03-01 02:30:00+00';
    }, 'the target rebuilt under ISO');
    await waitForStatus(handle, d.target, 'live');
    await expectMatchesDefinition(db.sql, d, {
      settings: { timezone: 'UTC', datestyle: 'ISO, DMY' },
    });

    const unknown = await rejection(
      handle.apply(`ALTER TRANSFORM st_altered SET (work_mem = '1GB')`),
    );
    expect(unknown).toMatchObject({ code: 'validation' });
    expect(unknown.message).toMatch(/work_mem is not a setting Trellis records/);
    // Keys travel as text in the engine's work: settings that would lose them are refused.
    await db.sql.unsafe('CREATE TABLE st_floats (id float8 PRIMARY KEY, v int)');
    const lossy = await rejection(
      db.sql.begin(async (tx) => {
        await tx.unsafe('SET LOCAL extra_float_digits = 0');
        await tx.unsafe(`SELECT trellis.apply('TRANSFORM st_float_copy FROM st_floats SELECT v')`);
      }),
    );
    expect(lossy.message).toContain(
      'a key of type double precision would not read back exactly from its text',
    );
    const abbreviated = await rejection(
      handle.apply(`ALTER TRANSFORM st_per_day SET (datestyle = 'SQL, DMY')`),
    );
    expect(abbreviated).toMatchObject({ code: 'validation' });
    expect(abbreviated.message).toContain('a key of type timestamp with time zone');

    const bad = await rejection(
      handle.apply(`ALTER TRANSFORM st_altered SET (timezone = 'Mars/Olympus')`),
    );
    expect(bad).toMatchObject({ code: 'validation' });
    expect(bad.message).toMatch(/Mars\/Olympus/);
  });
});
