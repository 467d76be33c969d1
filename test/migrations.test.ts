import { describe, expect, it } from 'vitest';
import { Trellis, TrellisError } from '../src/engine/index.js';
import { installSql, latestVersion, upgradeSql } from '../src/engine/schema/install-sql.js';
import { migrations } from '../src/engine/schema/migrations.generated.js';
import { freshDatabase, sqlClient } from './support/database.js';
import { expectMatchesDefinition } from './support/oracle.js';
import { waitFor, waitForStatus } from './support/trellis.js';

const quiet = { logger: { debug() {}, info() {}, warn() {}, error() {} } };

async function versions(sql: import('postgres').Sql, schema = 'trellis'): Promise<number[]> {
  const rows = await sql.unsafe(`SELECT version FROM "${schema}".migrations ORDER BY version`);
  return rows.map((r) => Number(r.version));
}

describe('migrate()', () => {
  it('installs the catalog schema on a fresh database, and a second run is a no-op', async () => {
    const db = await freshDatabase();
    await using trellis = await Trellis.connect({ url: db.url, ...quiet });
    expect(await trellis.migrate()).toEqual({ from: 0, to: latestVersion() });
    const applied = await versions(db.sql);
    expect(applied).toEqual(Array.from({ length: latestVersion() }, (_, i) => i + 1));
    const [before] = await db.sql`SELECT max(applied_at) AS at FROM trellis.migrations`;
    expect(await trellis.migrate()).toEqual({ from: latestVersion(), to: latestVersion() });
    const [after] = await db.sql`SELECT max(applied_at) AS at FROM trellis.migrations`;
    expect(after?.at).toEqual(before?.at);
  });

  it('lets migrators race on a fresh database: all succeed, the schema is installed once', async () => {
    const db = await freshDatabase();
    const handles = await Promise.all(
      [1, 2, 3].map(() => Trellis.connect({ url: db.url, schema: 'raced', ...quiet })),
    );
    try {
      const results = await Promise.all(handles.slice(0, 2).map((h) => h.migrate()));
      // Exactly one of the two did the install; the other found it done.
      expect(results.map((r) => r.to)).toEqual([latestVersion(), latestVersion()]);
      expect(await versions(db.sql, 'raced')).toHaveLength(latestVersion());
      // A third is a no-op.
      expect(await handles[2]!.migrate()).toEqual({ from: latestVersion(), to: latestVersion() });
    } finally {
      await Promise.all(handles.map((h) => h.shutdown()));
    }
  });

  it('installs into a schema with a name that needs quoting', async () => {
    const db = await freshDatabase();
    const schema = 'Odd "schema"; DROP TABLE x';
    await using trellis = await Trellis.connect({ url: db.url, schema, ...quiet });
    await trellis.migrate();
    const [row] =
      await db.sql`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = ${schema}`;
    expect(row?.n).toBe(1);
  });

  it('mixes with the printed install SQL, run inside another transaction, in either order', async () => {
    const db = await freshDatabase();
    const sql = installSql({ schema: 'trellis', targetSchema: 'public' });
    // As a drizzle-kit migration would: inside a transaction, beside other DDL.
    await db.sql.begin(async (tx) => {
      await tx.unsafe('CREATE TABLE app_table (id int PRIMARY KEY)');
      await tx.unsafe(sql);
    });
    await db.sql.unsafe(sql); // again: idempotent
    await using trellis = await Trellis.connect({ url: db.url, ...quiet });
    expect(await trellis.migrate()).toEqual({ from: latestVersion(), to: latestVersion() });
    expect(await versions(db.sql)).toHaveLength(latestVersion());
  });

  it('rolls back with the transaction it ran in', async () => {
    const db = await freshDatabase();
    const sql = installSql({ schema: 'rolled', targetSchema: 'public' });
    await expect(
      db.sql.begin(async (tx) => {
        await tx.unsafe(sql);
        throw new Error('the migration failed later');
      }),
    ).rejects.toThrow('the migration failed later');
    // pg-boss's part (the jobs schema) too: its own BEGIN … COMMIT are not in the SQL.
    const [row] = await db.sql`SELECT to_regnamespace('rolled') AS ns,
                                      to_regnamespace('rolled_jobs') AS jobs`;
    expect(row).toEqual({ ns: null, jobs: null });
  });

  it('refuses a schema holding a breaking migration newer than this code knows', async () => {
    const db = await freshDatabase();
    await using trellis = await Trellis.connect({ url: db.url, schema: 'future', ...quiet });
    await trellis.migrate();
    const newer = latestVersion() + 1;
    await db.sql.unsafe(
      `INSERT INTO future.migrations (version, name, breaking) VALUES (${newer}, 'from_the_future', true)`,
    );
    const refused = await trellis.migrate().catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(TrellisError);
    expect((refused as TrellisError).code).toBe('incompatible_schema');
    expect((refused as TrellisError).message).toContain(`breaking version ${newer}`);
    const connect = await Trellis.connect({ url: db.url, schema: 'future', ...quiet }).catch(
      (e: unknown) => e,
    );
    expect((connect as TrellisError).code).toBe('incompatible_schema');
    // The printed SQL refuses it too, with the same code.
    const printed = await db.sql
      .unsafe(installSql({ schema: 'future', targetSchema: 'public' }))
      .catch((e: unknown) => e);
    expect((printed as { code?: string }).code).toBe('TRI01');
  });

  it('accepts a newer schema whose newer migrations are not breaking', async () => {
    const db = await freshDatabase();
    await using first = await Trellis.connect({ url: db.url, schema: 'compatible', ...quiet });
    await first.migrate();
    await db.sql.unsafe(
      `INSERT INTO compatible.migrations (version, name, breaking) VALUES (${latestVersion() + 1}, 'additive', false)`,
    );
    await using second = await Trellis.connect({ url: db.url, schema: 'compatible', ...quiet });
    expect((await second.migrate()).to).toBe(latestVersion() + 1);
  });

  it('refuses workers and reads on a schema older than this trellis-pg, until it is upgraded', async () => {
    const db = await freshDatabase();
    // Installed by an older trellis-pg: every migration but the last.
    const older = migrations.slice(0, -1);
    await db.sql.unsafe(
      installSql({ schema: 'trellis', targetSchema: 'public', migrations: older }),
    );
    const refused = await Trellis.connect({ url: db.url, staging: true, ...quiet }).catch(
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(TrellisError);
    expect((refused as TrellisError).code).toBe('not_migrated');
    expect((refused as TrellisError).message).toBe(
      `the Trellis schema trellis is at version ${latestVersion(older)}, and this trellis-pg needs version ${latestVersion()}: run migrate() (or add the migration \`trellis generate upgrade\` writes) before connecting with workers`,
    );
    await using plain = await Trellis.connect({ url: db.url, ...quiet });
    const read = await plain.definitions().catch((e: unknown) => e);
    expect((read as TrellisError).code).toBe('not_migrated');
    expect(await plain.migrate()).toEqual({ from: latestVersion(older), to: latestVersion() });
    expect(await plain.definitions()).toEqual([]);
    await using worker = await Trellis.connect({ url: db.url, staging: true, ...quiet });
    await waitFor(() => worker.hasLiveStagingWorker(), 'the staging worker to be elected');
  });

  it('upgrades with only the migrations after the installed version, and refuses a database below it naming what to run', async () => {
    const db = await freshDatabase();
    const from = latestVersion() - 3;
    const older = migrations.filter((m) => m.version <= from);
    await db.sql.unsafe(
      installSql({ schema: 'trellis', targetSchema: 'public', migrations: older }),
    );
    const upgrade = upgradeSql({ schema: 'trellis', targetSchema: 'public', from });
    // Only the newer migrations' SQL: none of the older ones' version steps.
    for (const m of older) expect(upgrade).not.toContain(`WHERE version = ${m.version})`);
    for (const m of migrations.filter((m) => m.version > from)) {
      expect(upgrade).toContain(`WHERE version = ${m.version})`);
    }
    expect(upgrade.length).toBeLessThan(
      installSql({ schema: 'trellis', targetSchema: 'public' }).length / 2,
    );

    // Inside a migration's transaction, and again (a no-op), and beside migrate().
    await db.sql.begin((tx) => tx.unsafe(upgrade));
    await db.sql.unsafe(upgrade);
    expect(await versions(db.sql)).toEqual(
      Array.from({ length: latestVersion() }, (_, i) => i + 1),
    );
    await using trellis = await Trellis.connect({ url: db.url, staging: true, ...quiet });
    expect(await trellis.migrate()).toEqual({ from: latestVersion(), to: latestVersion() });
    await waitFor(() => trellis.hasLiveStagingWorker(), 'the staging worker to be elected');

    // A database below `from` (here: without the schema) is told what to run, and is left as it was.
    const fresh = await freshDatabase();
    const refused = await fresh.sql.unsafe(upgrade).catch((e: unknown) => e);
    expect(refused).toMatchObject({
      code: 'TRI01',
      message: `the Trellis schema trellis is at version 0, and this migration upgrades it from version ${from} to ${latestVersion()}`,
      hint: `run the migrations that bring it to version ${from} first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)`,
    });
    const [left] = await fresh.sql`SELECT to_regnamespace('trellis') AS ns`;
    expect(left?.ns).toBeNull();
  });

  it('carries transforms defined before settings were recorded over: the defaults recorded, a source with row level security opted in, nothing paused', async () => {
    const db = await freshDatabase();
    // Every migration before the one that records settings (ADRs 0033, 0034).
    const before = migrations.slice(
      0,
      migrations.findIndex((m) => m.name === 'definition_settings'),
    );
    await db.sql.unsafe(`ALTER DATABASE "${db.name}" SET timezone = 'Asia/Tokyo'`);
    // A session opened after the ALTER: the defaults the engine's sessions had.
    const sql = sqlClient(db.url, { max: 1 });
    try {
      await sql.unsafe(
        installSql({ schema: 'trellis', targetSchema: 'public', migrations: before }),
      );
      await sql.unsafe(`
        CREATE TABLE up_docs (id int PRIMARY KEY, at timestamptz NOT NULL);
        INSERT INTO up_docs SELECT i, '2024-03-01 00:00:00+00'::timestamptz + i * interval '5 hours'
          FROM generate_series(1, 40) i;
        ALTER TABLE up_docs ENABLE ROW LEVEL SECURITY;
        SELECT trellis.apply('TRANSFORM up_days FROM up_docs SELECT at::date AS day');`);
      await sql.unsafe(installSql({ schema: 'trellis', targetSchema: 'public' }));
    } finally {
      await sql.end();
    }
    await using worker = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 1,
      ...quiet,
    });
    const status = await waitForStatus(worker, 'up_days', 'live');
    expect(status.rowSecurity).toEqual([
      { table: 'public.up_docs', forced: false, optedOut: true },
    ]);
    const [definition] = await worker.definitions();
    expect(definition?.settings).toMatchObject({ timezone: 'Asia/Tokyo' });
    expect(definition?.options.withoutRowSecurity).toBe(true);
    expect(definition?.statement).toMatch(/ WITHOUT ROW SECURITY$/);
    await expectMatchesDefinition(
      db.sql,
      { target: 'up_days', from: 'up_docs', select: 'at::date AS day', implicit: 'id' },
      { settings: { timezone: 'Asia/Tokyo' } },
    );
  });

  it('refuses a handle whose targetSchema differs from the instance’s', async () => {
    const db = await freshDatabase();
    await db.sql`CREATE SCHEMA derived`;
    await using first = await Trellis.connect({ url: db.url, targetSchema: 'derived', ...quiet });
    await first.migrate();
    const other = await Trellis.connect({ url: db.url, targetSchema: 'public', ...quiet }).catch(
      (e: unknown) => e,
    );
    expect((other as TrellisError).code).toBe('conflict');
    expect((other as TrellisError).message).toContain("targetSchema: 'derived'");
  });
});
