import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPostgres } from '../src/testing/index.js';
import { plainConnect } from './support/capture-mode.js';
import { freshDatabase, serverInfo, sqlClient, type TestDatabase } from './support/database.js';
import { quietLogger, rejection } from './support/trellis.js';

// The instance's capture setting (ADR 0023): recorded in the catalog, 'trigger' by default,
// and 'logical' refused, naming the setting to change, where the server or role cannot
// run it.

let db: TestDatabase;
const role = `trellis_norepl_${process.pid}_${Date.now().toString(36)}`;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`CREATE ROLE ${role} LOGIN NOREPLICATION`);
  const migrator = await plainConnect({ url: db.url, logger: quietLogger });
  await migrator.migrate();
  await migrator.shutdown();
});

afterAll(async () => {
  await db.sql.unsafe(`DROP OWNED BY ${role}; DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
});

async function setting(): Promise<{ capture: string; limit: string }> {
  const [row] = await db.sql<{ capture: string; limit: string }[]>`
    SELECT capture, wal_retention_limit::text AS limit FROM trellis.config`;
  return row!;
}

describe('capture setting', () => {
  it("is 'trigger' at install, and a handle given capture records it (left out, it stands)", async () => {
    expect(await setting()).toEqual({ capture: 'trigger', limit: String(4 * 1024 ** 3) });

    const logical = await plainConnect({
      url: db.url,
      logger: quietLogger,
      capture: 'logical',
      walRetentionLimit: 1024 ** 3,
    });
    await logical.shutdown();
    expect(await setting()).toEqual({ capture: 'logical', limit: String(1024 ** 3) });

    const plain = await plainConnect({ url: db.url, logger: quietLogger });
    await plain.shutdown();
    expect(await setting()).toEqual({ capture: 'logical', limit: String(1024 ** 3) });

    const back = await plainConnect({ url: db.url, logger: quietLogger, capture: 'trigger' });
    await back.migrate();
    await back.shutdown();
    expect(await setting()).toEqual({ capture: 'trigger', limit: String(1024 ** 3) });
  });

  it('refuses bad values with validation before connecting', async () => {
    for (const options of [
      { capture: 'wal' },
      { walRetentionLimit: 0 },
      { walRetentionLimit: 1.5 },
    ]) {
      const error = await rejection(
        plainConnect({ url: db.url, logger: quietLogger, ...(options as object) }),
      );
      expect(error.code).toBe('validation');
    }
  });

  it('refuses logical capture for a role without REPLICATION, naming the attribute', async () => {
    await db.sql.unsafe(
      `GRANT USAGE ON SCHEMA trellis TO ${role}; GRANT SELECT ON ALL TABLES IN SCHEMA trellis TO ${role}`,
    );
    // EXECUTE is not PUBLIC's (ADR 0034): the role is granted what the call needs, so that
    // what refuses it is its missing REPLICATION, not a missing grant.
    await db.sql.unsafe(
      `GRANT EXECUTE ON FUNCTION trellis.set_capture(text, bigint), trellis._check_logical_capture(),
         trellis._fail(text, text, text) TO ${role}`,
    );
    const url = new URL(db.url);
    url.username = role;
    url.password = '';
    const error = await rejection(
      plainConnect({ url: url.toString(), logger: quietLogger, capture: 'logical' }),
    );
    expect(error.code).toBe('validation');
    expect(error.message).toContain('REPLICATION');
    expect(error.message).toContain(`ALTER ROLE ${role} REPLICATION`);
    // The same from SQL, as a migration would call it.
    const asRole = sqlClient(url.toString(), { max: 1 });
    try {
      const sqlError = await rejection(asRole.unsafe(`SELECT trellis.set_capture('logical')`));
      expect(sqlError.code).toBe('TRV01');
    } finally {
      await asRole.end();
    }
    expect((await setting()).capture).toBe('trigger');
  });

  const kind = serverInfo().kind;
  it.runIf(kind === 'path' || kind === 'embedded')(
    'refuses logical capture where wal_level is not logical, naming the setting',
    async () => {
      const server = await startPostgres({
        kind: kind as 'path' | 'embedded',
        settings: { wal_level: 'replica' },
      });
      try {
        const { url } = await server.createDatabase();
        const migrator = await plainConnect({ url, logger: quietLogger });
        await migrator.migrate();
        await migrator.shutdown();
        const error = await rejection(
          plainConnect({ url, logger: quietLogger, capture: 'logical' }),
        );
        expect(error.code).toBe('validation');
        expect(error.message).toMatch(/wal_level = logical.*wal_level = replica.*restart Postgres/);
      } finally {
        await server.stop();
      }
    },
  );
});
