import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { migratedTrellis } from './support/trellis.js';

// drizzle-kit over a schema that exports Trellis targets next to the app's tables: it must
// never write DDL for a target (they are existing views to it), and `push` with the
// tablesFilter the README documents must leave targets and Trellis's schema alone.
const run = promisify(execFile);
const repo = resolve(import.meta.dirname, '..');
const drizzleKit = join(repo, 'node_modules', 'drizzle-kit', 'bin.cjs');

const SCHEMA = `
import { eq, gt, sql } from 'drizzle-orm';
import { integer, numeric, pgTable, text } from 'drizzle-orm/pg-core';
import { statementOf, transform } from ${JSON.stringify(join(repo, 'src/drizzle/index.ts'))};

export const customers = pgTable('customers', { id: integer().primaryKey(), name: text().notNull() });
export const orders = pgTable('orders', {
  id: integer().primaryKey(),
  customerId: integer('customer_id').notNull().references(() => customers.id),
  amount: numeric().notNull(),
});
export const customerTotals = transform('customer_totals', (t) =>
  t.from(orders)
    .innerJoin(customers, eq(orders.customerId, customers.id))
    .select({ customerId: orders.customerId, name: customers.name, total: sql<string>\`sum(\${orders.amount})\` })
    .groupBy(orders.customerId, customers.name),
);
export const bigOrders = transform('big_orders', (t) =>
  t.from(orders).select({ id: orders.id, amount: orders.amount }).where(gt(orders.amount, '100')),
);
export const statements = [statementOf(customerTotals), statementOf(bigOrders)];
`;

function config(tablesFilter: string[] | undefined): string {
  return `
import { defineConfig } from 'drizzle-kit';
export default defineConfig({
  dialect: 'postgresql',
  schema: './schema.ts',
  out: './drizzle',
  dbCredentials: { url: process.env.DATABASE_URL! },
  ${tablesFilter ? `tablesFilter: ${JSON.stringify(tablesFilter)},` : ''}
});
`;
}

let project = '';
let db: TestDatabase;

async function kit(args: string[]): Promise<string> {
  try {
    const { stdout, stderr } = await run(process.execPath, [drizzleKit, ...args], {
      cwd: project,
      env: { ...process.env, DATABASE_URL: db.url, NO_COLOR: '1' },
      timeout: 60_000,
    });
    return stdout + stderr;
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string };
    throw new Error(`drizzle-kit ${args.join(' ')} failed:\n${e.stdout ?? ''}${e.stderr ?? ''}`, {
      cause: error,
    });
  }
}

beforeAll(async () => {
  db = await freshDatabase();
  project = await mkdtemp(join(tmpdir(), 'trellis-drizzle-kit-'));
  // The project reads drizzle-orm and drizzle-kit from this repository's node_modules.
  await symlink(join(repo, 'node_modules'), join(project, 'node_modules'));
  await writeFile(join(project, 'schema.ts'), SCHEMA);
  await writeFile(join(project, 'drizzle.config.ts'), config(['!customer_totals', '!big_orders']));
  await writeFile(join(project, 'unfiltered.config.ts'), config(undefined));
});

afterAll(async () => {
  if (project) await rm(project, { recursive: true, force: true });
});

describe('drizzle-kit over a schema that exports targets', { timeout: 180_000 }, () => {
  it('generate writes DDL for the tables and none for the targets', async () => {
    await kit(['generate', '--name', 'init']);
    const files = await readdir(join(project, 'drizzle'));
    expect(files.filter((f) => f.endsWith('.sql'))).toEqual(['0000_init.sql']);
    const ddl = await readFile(join(project, 'drizzle', '0000_init.sql'), 'utf8');
    const statements = ddl.split('--> statement-breakpoint').map((s) => s.trim());
    expect(statements.some((s) => s.startsWith('CREATE TABLE "customers"'))).toBe(true);
    expect(statements.some((s) => s.startsWith('CREATE TABLE "orders"'))).toBe(true);
    expect(statements.filter((s) => /customer_totals|big_orders/.test(s))).toEqual([]);
    // drizzle-kit knows them as existing views: in its snapshot, with no definition.
    const snapshot = JSON.parse(
      await readFile(join(project, 'drizzle', 'meta', '0000_snapshot.json'), 'utf8'),
    ) as { views: Record<string, { isExisting: boolean; definition?: string }> };
    expect(Object.keys(snapshot.views).sort()).toEqual([
      'public.big_orders',
      'public.customer_totals',
    ]);
    expect(Object.values(snapshot.views).every((v) => v.isExisting && !v.definition)).toBe(true);
    // Nothing changed, so nothing to generate: the targets cause no drift.
    expect(await kit(['generate', '--name', 'again'])).toContain('No schema changes');
    expect((await readdir(join(project, 'drizzle'))).filter((f) => f.endsWith('.sql'))).toEqual([
      '0000_init.sql',
    ]);
  });

  it('push with the documented tablesFilter leaves targets and Trellis alone', async () => {
    await kit(['migrate']);
    const trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
    try {
      const { statements } = (await import(join(project, 'schema.ts'))) as {
        statements: string[];
      };
      for (const statement of statements) await trellis.apply(statement);
      await db.sql.unsafe(`
        INSERT INTO customers VALUES (1, 'Ada'), (2, 'Bo');
        INSERT INTO orders VALUES (1, 1, 250), (2, 1, 5), (3, 2, 7)`);
      const token = await trellis.watermarkToken();
      for (const target of ['customer_totals', 'big_orders']) {
        await trellis.awaitConverged(target, token, { timeoutMs: 20_000 });
      }
      const trellisTables = () =>
        db.sql`SELECT count(*)::int AS n FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'trellis'`;
      const [before] = await trellisTables();

      const pushed = await kit(['push', '--force']);
      expect(pushed).toMatch(/No changes detected/);
      const totals = await db.sql`SELECT "customerId", name, total FROM customer_totals ORDER BY 1`;
      expect(totals).toEqual([
        { customerId: 1, name: 'Ada', total: '255' },
        { customerId: 2, name: 'Bo', total: '7' },
      ]);
      expect(await db.sql`SELECT id, amount FROM big_orders`).toEqual([{ id: 1, amount: '250' }]);
      expect((await trellisTables())[0]).toEqual(before);

      // Still maintained after the push.
      await db.sql`INSERT INTO orders VALUES (4, 2, 500)`;
      await trellis.awaitConverged('big_orders', await trellis.watermarkToken(), {
        timeoutMs: 20_000,
      });
      expect(await db.sql`SELECT id FROM big_orders ORDER BY id`).toEqual([{ id: 1 }, { id: 4 }]);
    } finally {
      await trellis.shutdown();
    }

    // Without the filter, push takes the targets for tables it does not know, and drops them.
    const unfiltered = await kit(['push', '--force', '--config', 'unfiltered.config.ts']);
    expect(unfiltered).toMatch(/Changes applied/);
    const [gone] = await db.sql`SELECT to_regclass('public.customer_totals') AS t`;
    expect(gone).toEqual({ t: null });
  });
});
