import type postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { TEST_CAPTURE, waitUntilOnTheSlot } from './support/capture-mode.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { quietLogger, rejection, waitForStatus } from './support/trellis.js';

// README's Privileges section, as real non-superuser roles live it: an owner role that
// migrates, defines and runs the workers; writers with nothing but INSERT/UPDATE/DELETE
// on their table, plus grantWriter (or not); a reader of targets.

const suffix = `${process.pid}_${Date.now().toString(36)}`;
const ROLES = {
  owner: `trellis_owner_${suffix}`,
  writer: `trellis_writer_${suffix}`,
  sqlWriter: `trellis_sqlwriter_${suffix}`,
  ungranted: `trellis_ungranted_${suffix}`,
  reader: `trellis_reader_${suffix}`,
  stranger: `trellis_stranger_${suffix}`,
};

const orders: Definition = {
  target: 'order_amounts',
  from: 'orders',
  select: 'amount',
  implicit: 'id',
};

let db: TestDatabase;
/** The owner's handle: migrate, define, staging worker and drain loops. */
let owner: Trellis;
/** The owner's own SQL session (a migration would run as this role). */
let ownerSql: postgres.Sql;

function urlAs(role: string): string {
  const url = new URL(db.url);
  url.username = role;
  url.password = '';
  return url.toString();
}

function clientAs(role: string): postgres.Sql {
  return sqlClient(urlAs(role), { max: 1 });
}

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE ROLE ${ROLES.owner} LOGIN ${TEST_CAPTURE === 'logical' ? 'REPLICATION' : ''};
    CREATE ROLE ${ROLES.writer} LOGIN;
    CREATE ROLE ${ROLES.sqlWriter} LOGIN;
    CREATE ROLE ${ROLES.ungranted} LOGIN;
    CREATE ROLE ${ROLES.reader} LOGIN;
    CREATE ROLE ${ROLES.stranger} LOGIN;
    GRANT CREATE ON DATABASE "${db.name}" TO ${ROLES.owner};
    GRANT CREATE ON SCHEMA public TO ${ROLES.owner};`);
  ownerSql = clientAs(ROLES.owner);
  await ownerSql.unsafe(`
    CREATE TABLE orders (id int PRIMARY KEY, amount int NOT NULL);
    INSERT INTO orders SELECT g, g * 10 FROM generate_series(1, 20) g;
    GRANT INSERT, UPDATE, DELETE ON orders
       TO ${ROLES.writer}, ${ROLES.sqlWriter}, ${ROLES.ungranted};`);
  const migrator = await Trellis.connect({ url: urlAs(ROLES.owner), logger: quietLogger });
  try {
    await migrator.migrate();
    await migrator.define(transformStatement(orders));
  } finally {
    await migrator.shutdown();
  }
  owner = await Trellis.connect({
    url: urlAs(ROLES.owner),
    logger: quietLogger,
    staging: true,
    drainThreads: 2,
  });
  await waitForStatus(owner, 'order_amounts', 'live');
  // Live comes before the slot alone (making it waits for every transaction in the
  // cluster): the WAL capture test below needs the source off its trigger.
  if (TEST_CAPTURE === 'logical') await waitUntilOnTheSlot(db.sql);
  await ownerSql.unsafe(`GRANT SELECT ON order_amounts TO ${ROLES.reader}`);
});

afterAll(async () => {
  await owner?.shutdown();
  await ownerSql?.end({ timeout: 2 });
  if (!db) return;
  const roles = Object.values(ROLES).join(', ');
  await db.sql.unsafe(`DROP OWNED BY ${roles} CASCADE`);
  await db.sql.unsafe(`DROP ROLE IF EXISTS ${roles}`);
});

async function converge(): Promise<void> {
  await owner.awaitConverged('order_amounts', await owner.watermarkToken(), { timeoutMs: 20_000 });
  await expectMatchesDefinition(db.sql, orders);
}

describe('privileges', () => {
  it('lets a role migrate, define and run the workers without being a superuser', async () => {
    const [role] = await db.sql<{ super: boolean }[]>`
      SELECT rolsuper AS super FROM pg_roles WHERE rolname = ${ROLES.owner}`;
    expect(role!.super).toBe(false);
    expect(await owner.hasLiveStagingWorker()).toBe(true);
    expect(await owner.hasLiveDrainWorkers()).toBe(true);
    await converge();
  });

  // Capture triggers run as the writer; WAL capture runs no code in the writer's session,
  // so a writer needs nothing of Trellis's there (ADR 0023), and its write is captured.
  it.skipIf(TEST_CAPTURE === 'logical')(
    'refuses a write by a role without grantWriter, with a permission error that says where',
    async () => {
      const sql = clientAs(ROLES.ungranted);
      try {
        const error = await rejection(sql`INSERT INTO orders VALUES (900, 1)`);
        expect(error.code).toBe('42501');
        expect(error.message).toContain('permission denied for schema trellis');
      } finally {
        await sql.end({ timeout: 2 });
      }
      const [row] = await db.sql<
        { n: number }[]
      >`SELECT count(*)::int AS n FROM orders WHERE id = 900`;
      expect(row!.n).toBe(0);
    },
  );

  it.runIf(TEST_CAPTURE === 'logical')(
    'under WAL capture, takes the write of a role without grantWriter',
    async () => {
      const sql = clientAs(ROLES.ungranted);
      try {
        await sql`INSERT INTO orders VALUES (900, 1)`;
      } finally {
        await sql.end({ timeout: 2 });
      }
      await converge();
    },
  );

  it('lets a writer granted by grantWriter insert, update and delete, and its changes reach the target', async () => {
    await owner.grantWriter(ROLES.writer);
    const sql = clientAs(ROLES.writer);
    try {
      await sql`INSERT INTO orders VALUES (101, 1), (102, 2)`;
      // No SELECT on the table: statements that read no column.
      await sql`UPDATE orders SET amount = 42`;
      await converge();
      await sql`DELETE FROM orders`;
      await sql`INSERT INTO orders VALUES (201, 5), (202, 6), (203, 7)`;
    } finally {
      await sql.end({ timeout: 2 });
    }
    await converge();
    const [row] = await db.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM order_amounts`;
    expect(row!.n).toBe(3);
  });

  it('grants from SQL too (a migration), in a transaction', async () => {
    await ownerSql.begin((tx) => tx`SELECT trellis.grant_writer(${ROLES.sqlWriter})`);
    const sql = clientAs(ROLES.sqlWriter);
    try {
      await sql`INSERT INTO orders VALUES (301, 9)`;
    } finally {
      await sql.end({ timeout: 2 });
    }
    await converge();
  });

  it('grants a writer exactly USAGE on the schema and INSERT on the ledger partitions', async () => {
    const granted = await db.sql<{ object: string; privilege: string }[]>`
      SELECT c.relname::text AS object, a.privilege_type AS privilege
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
       WHERE c.relnamespace = 'trellis'::regnamespace AND a.grantee = ${ROLES.writer}::regrole
      UNION ALL
      SELECT 'schema ' || n.nspname, a.privilege_type
        FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
       WHERE n.nspname = 'trellis' AND a.grantee = ${ROLES.writer}::regrole
      UNION ALL
      SELECT 'function ' || p.proname, a.privilege_type
        FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
       WHERE p.pronamespace = 'trellis'::regnamespace AND a.grantee = ${ROLES.writer}::regrole
       ORDER BY 1, 2`;
    expect(granted).toEqual([
      { object: 'ledger_0', privilege: 'INSERT' },
      { object: 'ledger_1', privilege: 'INSERT' },
      { object: 'ledger_2', privilege: 'INSERT' },
      { object: 'schema trellis', privilege: 'USAGE' },
    ]);
  });

  it('refuses grant_writer from a role that cannot grant, and grantWriter for a role that does not exist', async () => {
    const sql = clientAs(ROLES.writer);
    try {
      // Only the owner executes Trellis's functions (ADR 0034)...
      const denied = await rejection(sql`SELECT trellis.grant_writer(${ROLES.ungranted})`);
      expect(denied.code).toBe('42501');
      expect(denied.message).toContain('permission denied for function grant_writer');
      // ...and a role the owner lets call it still cannot grant what it does not hold.
      await ownerSql.unsafe(
        `GRANT EXECUTE ON FUNCTION trellis.grant_writer(regrole) TO ${ROLES.writer}`,
      );
      const refused = await rejection(sql`SELECT trellis.grant_writer(${ROLES.ungranted})`);
      expect(refused.code).toBe('42501');
      expect(refused.message).toContain('cannot grant');
    } finally {
      await ownerSql.unsafe(
        `REVOKE EXECUTE ON FUNCTION trellis.grant_writer(regrole) FROM ${ROLES.writer}`,
      );
      await sql.end({ timeout: 2 });
    }
    const [row] = await db.sql<{ usage: boolean }[]>`
      SELECT has_schema_privilege(${ROLES.ungranted}, 'trellis', 'USAGE') AS usage`;
    expect(row!.usage).toBe(false);
    const missing = await rejection(owner.grantWriter('no_such_role_anywhere'));
    expect(missing.code).toBe('not_found');
    expect((await rejection(owner.grantWriter(''))).code).toBe('validation');
  });

  it("lets no role but the owner execute a function of Trellis's schema, not even one with USAGE on it", async () => {
    await ownerSql.unsafe(`GRANT USAGE ON SCHEMA trellis TO ${ROLES.stranger}`);
    // Every function, the capture functions the staging worker made at run time included.
    const executable = await db.sql<{ fn: string; role: string }[]>`
      SELECT p.oid::regprocedure::text AS fn, r.rolname::text AS role
        FROM pg_proc p CROSS JOIN pg_roles r
       WHERE p.pronamespace IN ('trellis'::regnamespace, 'trellis_jobs'::regnamespace)
         AND r.rolname IN (${ROLES.stranger}, ${ROLES.writer}, ${ROLES.reader})
         AND has_function_privilege(r.oid, p.oid, 'EXECUTE')`;
    expect(executable).toEqual([]);
    const [capture] = await db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_proc
       WHERE pronamespace = 'trellis'::regnamespace AND proname LIKE 'capture%'`;
    if (TEST_CAPTURE !== 'logical') expect(capture!.n).toBeGreaterThan(0);

    const sql = clientAs(ROLES.stranger);
    try {
      for (const call of [
        sql`SELECT trellis.status('order_amounts')`,
        sql`SELECT trellis.apply('DROP TRANSFORM order_amounts')`,
        sql`SELECT * FROM trellis.definitions()`,
      ]) {
        const error = await rejection(call);
        expect(error.code).toBe('42501');
        expect(error.message).toMatch(/permission denied for function/);
      }
    } finally {
      await sql.end({ timeout: 2 });
    }
    await waitForStatus(owner, 'order_amounts', 'live');
  });

  it('lets a reader SELECT a target, and not write it', async () => {
    const sql = clientAs(ROLES.reader);
    try {
      const rows = await sql`SELECT id, amount FROM order_amounts ORDER BY id`;
      expect(rows.length).toBeGreaterThan(0);
      for (const attempt of [
        sql`INSERT INTO order_amounts (id, amount) VALUES (999, 1)`,
        sql`UPDATE order_amounts SET amount = 0`,
        sql`DELETE FROM order_amounts`,
      ]) {
        expect((await rejection(attempt)).code).toBe('42501');
      }
    } finally {
      await sql.end({ timeout: 2 });
    }
    await expectMatchesDefinition(db.sql, orders);
  });
});
