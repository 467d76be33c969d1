import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, definitionQuery, expectMatchesDefinition } from './support/oracle.js';

// A fresh drizzle project, as a Drizzle team adopts Trellis: its own package.json,
// drizzle.config.ts and schema, with trellis-pg built from this repository and every other
// package taken from this repository's node_modules (no network, no install step).
// Tables and a target declared with the builder; `trellis generate install`, drizzle-kit
// generate, `trellis generate transform --from`, drizzle-kit migrate on real Postgres; a
// worker; typed rows read through drizzle equal to the recompute; tsc refusing a wrong column.
const repo = resolve(import.meta.dirname, '..');
const SLOW = 240_000;

const PACKAGE = { name: 'shop', private: true, type: 'module' };

const CONFIG = `import { defineConfig } from 'drizzle-kit';

export default defineConfig({
  dialect: 'postgresql',
  schema: './src/schema.ts',
  out: './drizzle',
  dbCredentials: { url: process.env.DATABASE_URL! },
  // Trellis owns its targets and its schema: drizzle-kit push must leave them alone.
  tablesFilter: ['!customer_totals', '!paying_customers'],
});
`;

const SCHEMA = `import { and, eq, exists, sql } from 'drizzle-orm';
import { index, integer, numeric, pgTable, text } from 'drizzle-orm/pg-core';
import { subquery, transform } from 'trellis-pg/drizzle';

export const customers = pgTable(
  'customers',
  {
    id: integer().primaryKey(),
    name: text().notNull(),
  },
  (t) => [index('customers_name_idx').on(t.name)],
);

export const orders = pgTable(
  'orders',
  {
    id: integer().primaryKey(),
    customerId: integer('customer_id').notNull().references(() => customers.id),
    amount: numeric().notNull(),
    status: text().notNull(),
  },
  (t) => [index('orders_customer_id_idx').on(t.customerId)],
);

export const customerTotals = transform('customer_totals', (t) =>
  t
    .from(orders)
    .innerJoin(customers, eq(orders.customerId, customers.id))
    .select({
      customerId: orders.customerId,
      name: customers.name,
      total: sql<string>\`sum(\${orders.amount})\`,
      orderCount: sql<number>\`count(*)\`.mapWith(Number),
    })
    .where(eq(orders.status, 'paid'))
    .groupBy(orders.customerId, customers.name),
);

// View SQL (the AS form): a correlated EXISTS over drizzle's own exists().
export const payingCustomers = transform('paying_customers', (t) =>
  t
    .from(customers)
    .select({ id: customers.id, name: customers.name })
    .where(
      exists(
        subquery((s) =>
          s
            .from(orders)
            .select({ one: sql<number>\`1\` })
            .where(and(eq(orders.customerId, customers.id), eq(orders.status, 'paid'))),
        ),
      ),
    ),
);
`;

const APP = `import { asc } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import { Trellis } from 'trellis-pg';
import { customers, customerTotals, orders } from './schema.js';

const url = process.env.DATABASE_URL!;
// The worker: this process runs the staging worker and a drain loop.
await using trellis = await Trellis.connect({ url, staging: true, drainThreads: 1 });
const client = postgres(url, { max: 2, onnotice: () => {} });
const db = drizzle({ client });

await db.insert(customers).values([{ id: 1, name: 'Ada' }, { id: 2, name: 'Bo' }, { id: 3, name: 'Cy' }]);
await db.insert(orders).values([
  { id: 1, customerId: 1, amount: '10.50', status: 'paid' },
  { id: 2, customerId: 1, amount: '4.25', status: 'paid' },
  { id: 3, customerId: 2, amount: '99', status: 'open' },
  { id: 4, customerId: 2, amount: '7', status: 'paid' },
]);
const token = await trellis.watermarkToken();
for (const target of ['customer_totals', 'paying_customers']) {
  await trellis.awaitConverged(target, token, { timeoutMs: 60_000 });
}

type Row = { customerId: number; name: string; total: string; orderCount: number };
const rows: Row[] = await db.select().from(customerTotals).orderBy(asc(customerTotals.customerId));
console.log(JSON.stringify(rows));
await client.end();
`;

// Each line marked "error" must fail to compile.
const BAD = `import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/postgres-js';
import { integer, pgTable } from 'drizzle-orm/pg-core';
import { subquery, transform } from 'trellis-pg/drizzle';
import { customers, customerTotals, orders } from './schema.js';

const products = pgTable('products', { id: integer().primaryKey(), price: integer() });
const db = drizzle(process.env.DATABASE_URL!);
export const a = db.select({ total: customerTotals.totl }).from(customerTotals); // error: misspelt
export const b = transform('b', (t) => t.from(orders).select({ price: products.price })); // error: not a table of the statement
export const c = transform('c', (t) => t.from(orders).select({ amount: orders.amuont })); // error: misspelt
export const d: Promise<{ total: number }[]> = db.select({ total: customerTotals.total }).from(customerTotals); // error: total is a string
export const e = subquery((s) => s.from(orders).select({ name: customers.name })); // error: not a table of the subquery
export const f = transform('f', (t) => t.from(orders).select({ id: orders.id }).unionAll(t.from(customers).select({ id: customers.name }))); // error: a string beside a number
export const ok = transform('ok', (t) => t.from(orders).select({ n: sql<number>\`1\` }));
`;

const TSCONFIG = {
  compilerOptions: {
    target: 'ES2022',
    lib: ['ES2022', 'ESNext.Disposable'],
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: ['node'],
  },
  include: ['src/schema.ts', 'src/app.ts'],
};

let app = '';
let db: TestDatabase;
const dirs: string[] = [];

interface Result {
  code: number;
  out: string;
}

function run(args: string[], env: Record<string, string> = {}): Promise<Result> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      args,
      {
        cwd: app,
        env: { ...process.env, DATABASE_URL: db.url, NO_COLOR: '1', ...env },
        timeout: 120_000,
        maxBuffer: 16 * 1024 * 1024,
      },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        done({ code, out: stdout + stderr });
      },
    );
  });
}

async function ok(args: string[]): Promise<string> {
  const result = await run(args);
  if (result.code !== 0) throw new Error(`${args.join(' ')} failed:\n${result.out}`);
  return result.out;
}

const bin = {
  trellis: 'node_modules/trellis-pg/dist/cli/main.js',
  drizzleKit: 'node_modules/drizzle-kit/bin.cjs',
  tsx: 'node_modules/tsx/dist/cli.mjs',
  tsc: 'node_modules/typescript/bin/tsc',
};

beforeAll(async () => {
  db = await freshDatabase();
  app = await mkdtemp(join(tmpdir(), 'trellis-drizzle-app-'));
  dirs.push(app);
  // trellis-pg as npm would install it: package.json and the build output.
  const installed = join(app, 'node_modules', 'trellis-pg');
  await mkdir(installed, { recursive: true });
  const build = await new Promise<Result>((done) =>
    execFile(
      process.execPath,
      [
        join(repo, 'node_modules/typescript/bin/tsc'),
        '-p',
        'tsconfig.build.json',
        '--outDir',
        join(installed, 'dist'),
        '--sourceMap',
        'false',
      ],
      { cwd: repo, timeout: SLOW },
      (error, stdout, stderr) => done({ code: error ? 1 : 0, out: stdout + stderr }),
    ),
  );
  if (build.code !== 0) throw new Error(`building trellis-pg failed:\n${build.out}`);
  await cp(join(repo, 'package.json'), join(installed, 'package.json'));
  // Everything else from this repository's node_modules, as a hoisted install has it.
  for (const entry of await readdir(join(repo, 'node_modules'))) {
    if (entry === '.bin' || entry.startsWith('.')) continue;
    // The workspace's own links (trellis-pg itself, the shop example): installed above, or not ours.
    if (entry === 'trellis-pg' || entry === 'trellis-shop-example') continue;
    await symlink(join(repo, 'node_modules', entry), join(app, 'node_modules', entry));
  }
  await writeFile(join(app, 'package.json'), JSON.stringify(PACKAGE, null, 2));
  await writeFile(join(app, 'drizzle.config.ts'), CONFIG);
  await writeFile(join(app, 'tsconfig.json'), JSON.stringify(TSCONFIG, null, 2));
  await mkdir(join(app, 'src'));
  await writeFile(join(app, 'src', 'schema.ts'), SCHEMA);
  await writeFile(join(app, 'src', 'app.ts'), APP);
  await writeFile(join(app, 'src', 'bad.ts'), BAD);
}, SLOW);

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

const customerTotals: Definition = {
  target: 'customer_totals',
  from: 'orders JOIN customers ON orders.customer_id = customers.id',
  select: `orders.customer_id AS "customerId", customers.name AS name, sum(orders.amount) AS total,
           count(*) AS "orderCount"`,
  where: "orders.status = 'paid'",
  groupBy: 'orders.customer_id, customers.name',
};

// The view SQL a user would write for the builder's EXISTS.
const payingCustomers: Definition = {
  form: 'as',
  target: 'paying_customers',
  select: 'c.id, c.name',
  from: 'customers c',
  where: `EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id AND o.status = 'paid')`,
};

describe('a fresh drizzle project', { timeout: SLOW }, () => {
  it('goes from the builder to typed reads through drizzle-kit migrations', async () => {
    expect(await ok([bin.trellis, 'generate', 'install'])).toContain(
      'Wrote drizzle/0000_trellis_install.sql',
    );
    await ok([bin.drizzleKit, 'generate', '--name', 'tables']);
    expect(await ok([bin.trellis, 'generate', 'transform', '--from', 'src/schema.ts'])).toContain(
      'Wrote drizzle/0002_trellis_transform_customer_totals_and_1_more.sql',
    );
    expect(await ok([bin.drizzleKit, 'generate'])).toContain('No schema changes');
    expect((await readdir(join(app, 'drizzle'))).filter((f) => f.endsWith('.sql'))).toEqual([
      '0000_trellis_install.sql',
      '0001_tables.sql',
      '0002_trellis_transform_customer_totals_and_1_more.sql',
    ]);
    const tables = await readFile(join(app, 'drizzle', '0001_tables.sql'), 'utf8');
    expect(tables).not.toContain('customer_totals');

    await ok([bin.drizzleKit, 'migrate']);
    expect(
      await db.sql`SELECT target_name FROM trellis.transforms
                    WHERE target_name NOT LIKE 'trellis#%' ORDER BY 1`,
    ).toEqual([{ target_name: 'customer_totals' }, { target_name: 'paying_customers' }]);
    // README's schema declares the index its transform needs: no gap to report.
    const [row] = await db.sql<{ gaps: unknown }[]>`
      SELECT trellis.status('customer_totals')->'sourceIndexGaps' AS gaps`;
    expect(row?.gaps).toEqual([]);

    const printed = await ok([bin.tsx, 'src/app.ts']);
    const rows = JSON.parse(printed.trim().split('\n').at(-1) as string) as unknown[];
    await expectMatchesDefinition(db.sql, customerTotals);
    await expectMatchesDefinition(db.sql, payingCustomers);
    const recomputed = await db.sql.unsafe(
      `SELECT "customerId", name, total::text AS total, "orderCount"::int AS "orderCount"
         FROM (${definitionQuery(customerTotals)}) d ORDER BY 1`,
    );
    expect(rows).toEqual([...recomputed]);
    expect(rows).toEqual([
      { customerId: 1, name: 'Ada', total: '14.75', orderCount: 2 },
      { customerId: 2, name: 'Bo', total: '7', orderCount: 1 },
    ]);
  });

  it('type-checks the app, and refuses a wrong column at compile time', async () => {
    // One tsc run over the app and the fixture: errors on the fixture's marked lines only.
    await writeFile(
      join(app, 'tsconfig.all.json'),
      JSON.stringify({ ...TSCONFIG, include: ['src/schema.ts', 'src/app.ts', 'src/bad.ts'] }),
    );
    const checked = await run([bin.tsc, '-p', 'tsconfig.all.json']);
    expect(checked.code).not.toBe(0);
    const errorLines = BAD.split('\n').flatMap((l, i) => (l.includes('// error') ? [i + 1] : []));
    const reported = [...checked.out.matchAll(/^(src\/[\w.]+)\((\d+),\d+\): error/gm)].map(
      (m) => `${m[1]}:${m[2]}`,
    );
    expect(reported).toEqual(errorLines.map((line) => `src/bad.ts:${line}`));
    expect(checked.out).toContain("Property 'totl' does not exist");
    expect(checked.out).toContain(`Type '"products"' is not assignable to type '"orders"'`);
    expect(checked.out).toContain("Property 'amuont' does not exist");
    expect(checked.out).toContain("Type 'string' is not assignable to type 'number'");
    expect(checked.out).toContain(`Type '"customers"' is not assignable to type '"orders"'`);
    expect(checked.out).toContain('the SELECTs of a set operation select the same keys');
  });
});
