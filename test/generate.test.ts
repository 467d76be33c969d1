import { execFile } from 'node:child_process';
import { cp, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { drizzle } from 'drizzle-orm/postgres-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeCustomMigration } from '../src/cli/generate/migration-folder.js';
import { redefinition } from '../src/cli/generate/transform-diff.js';
import { runCli } from '../src/cli/run.js';
import { installSql } from '../src/engine/schema/install-sql.js';
import { migrations } from '../src/engine/schema/migrations.generated.js';
import { latestVersion } from '../src/migration/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

// `trellis generate …` in a drizzle-kit project, run as a user runs it (a child process in
// the project's directory), next to drizzle-kit itself.
const repo = resolve(import.meta.dirname, '..');
const tsx = join(repo, 'node_modules', 'tsx', 'dist', 'cli.mjs');
const drizzleKit = join(repo, 'node_modules', 'drizzle-kit', 'bin.cjs');

interface Result {
  code: number;
  out: string;
  err: string;
}

function exec(
  cwd: string,
  args: string[],
  env: Record<string, string | undefined>,
): Promise<Result> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      args,
      {
        cwd,
        env: { ...process.env, DATABASE_URL: undefined, NO_COLOR: '1', ...env },
        timeout: 60_000,
      },
      (error, out, err) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        done({ code, out, err });
      },
    );
  });
}

const SCHEMA = `
import { integer, numeric, pgTable, text } from 'drizzle-orm/pg-core';
export const customers = pgTable('customers', { id: integer().primaryKey(), name: text().notNull() });
export const orders = pgTable('orders', {
  id: integer().primaryKey(),
  customerId: integer('customer_id').notNull(),
  amount: numeric().notNull(),
});
`;
const CONFIG = `
import { defineConfig } from 'drizzle-kit';
export default defineConfig({
  dialect: 'postgresql',
  schema: './schema.ts',
  out: './migrations',
  dbCredentials: { url: process.env.DATABASE_URL! },
});
`;

const BUILDER = join(repo, 'src', 'drizzle', 'index.ts');
const BIG_ORDERS =
  'TRANSFORM "big_orders"\nFROM "orders"\nSELECT "orders"."id" AS "id", "orders"."amount" AS "amount"\nWHERE "orders"."amount" > \'100\'';
const customerSpend = (minimum: number) =>
  `TRANSFORM "customer_spend"\nFROM "orders"\nSELECT "orders"."customer_id" AS "customerId", sum("orders"."amount") AS "spent"\nWHERE "orders"."amount" > '${minimum}'\nGROUP BY "orders"."customer_id"`;
const SPEND_TIERS =
  'TRANSFORM "spend_tiers"\nFROM "customer_spend"\nSELECT "customer_spend"."customerId" AS "customerId", "customer_spend"."spent" > 1000 AS "big"';

/** The module `--from` reads: three targets, one a chain, as the app changes them. */
function transforms(o: { extraColumn: boolean; minimum: number; withoutBigOrders?: boolean }) {
  return `
import { gt, sql } from 'drizzle-orm';
import { transform } from ${JSON.stringify(BUILDER)};
import { orders } from './schema.ts';
${
  o.withoutBigOrders
    ? ''
    : `export const bigOrders = transform('big_orders', (t) =>
  t.from(orders)
    .select({ id: orders.id, amount: orders.amount${o.extraColumn ? ', customerId: orders.customerId' : ''} })
    .where(gt(orders.amount, '100')),
);`
}
export const customerSpend = transform('customer_spend', (t) =>
  t.from(orders)
    .select({ customerId: orders.customerId, spent: sql<string>\`sum(\${orders.amount})\` })
    .where(gt(orders.amount, '${o.minimum}'))
    .groupBy(orders.customerId),
);
export const spendTiers = transform('spend_tiers', (t) =>
  t.from(customerSpend)
    .select({ customerId: customerSpend.customerId, big: sql<boolean>\`\${customerSpend.spent} > 1000\` }),
);
`;
}

const dirs: string[] = [];
let db: TestDatabase;

async function project(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'trellis-generate-'));
  dirs.push(dir);
  await symlink(join(repo, 'node_modules'), join(dir, 'node_modules'));
  await writeFile(join(dir, 'schema.ts'), SCHEMA);
  await writeFile(join(dir, 'drizzle.config.ts'), CONFIG);
  return dir;
}

const trellis = (cwd: string, args: string[], env: Record<string, string> = {}) =>
  exec(cwd, [tsx, join(repo, 'src/cli/main.ts'), ...args], env);
async function inProcess(argv: string[], env: Record<string, string>): Promise<Result> {
  let out = '';
  let err = '';
  const code = await runCli(argv, { out: (t) => (out += t), err: (t) => (err += t), env });
  return { code, out, err };
}
const kit = (cwd: string, args: string[]) =>
  exec(cwd, [drizzleKit, ...args], { DATABASE_URL: db.url });

/** The folder as text, with what differs between any two runs (ids, times) numbered. */
async function folder(dir: string): Promise<Record<string, unknown>> {
  const ids = new Map<string, string>();
  const id = (value: string) => {
    if (value === '' || value === '00000000-0000-0000-0000-000000000000') return value;
    if (!ids.has(value)) ids.set(value, `id${ids.size}`);
    return ids.get(value);
  };
  const files: Record<string, unknown> = {};
  for (const name of (await readdir(join(dir, 'meta'))).sort()) {
    const json = JSON.parse(await readFile(join(dir, 'meta', name), 'utf8')) as Record<
      string,
      unknown
    >;
    if (name === '_journal.json') {
      const entries = json.entries as Array<Record<string, unknown>>;
      files[name] = { ...json, entries: entries.map((e) => ({ ...e, when: typeof e.when })) };
    } else {
      files[name] = { ...json, id: id(json.id as string), prevId: id(json.prevId as string) };
    }
    files[`${name} (text layout)`] = (await readFile(join(dir, 'meta', name), 'utf8'))
      .replace(/"[0-9a-f-]{36}"/g, '"…"')
      .replace(/"when": \d+/g, '"when": …');
  }
  files['sql files'] = (await readdir(dir)).filter((f) => f.endsWith('.sql')).sort();
  return files;
}

beforeAll(async () => {
  db = await freshDatabase();
});

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe('trellis generate', () => {
  it('writes the journal entry and snapshot drizzle-kit generate --custom writes', {
    timeout: 150_000,
  }, async () => {
    const ours = await project();
    expect((await kit(ours, ['generate', '--name', 'tables'])).code).toBe(0);
    const theirs = `${ours}-kit`;
    dirs.push(theirs);
    await cp(ours, theirs, { recursive: true, verbatimSymlinks: true });

    const installed = await trellis(ours, ['generate', 'install']);
    expect(installed).toMatchObject({ code: 0, err: '' });
    expect(installed.out).toBe(
      'Wrote migrations/0001_trellis_install.sql: drizzle-kit migrate applies it\n',
    );
    expect((await kit(theirs, ['generate', '--custom', '--name', 'trellis_install'])).code).toBe(0);
    expect(await folder(join(ours, 'migrations'))).toEqual(
      await folder(join(theirs, 'migrations')),
    );

    // drizzle-kit carries on from our snapshot: no drift, and its next migration follows.
    const again = await kit(ours, ['generate', '--name', 'nothing']);
    expect(again.out).toContain('No schema changes');
    await writeFile(
      join(ours, 'schema.ts'),
      `${SCHEMA}\nexport const extra = pgTable('extra', { id: integer().primaryKey() });\n`,
    );
    expect((await kit(ours, ['generate', '--name', 'extra'])).code).toBe(0);
    const sql = await readFile(join(ours, 'migrations', '0002_extra.sql'), 'utf8');
    expect(sql).toMatch(/^CREATE TABLE "extra"/);

    const sqlText = await readFile(join(ours, 'migrations', '0001_trellis_install.sql'), 'utf8');
    expect(sqlText).toContain(
      `-- trellis-pg: install or upgrade the Trellis catalog schema "trellis" to version ${latestVersion()}.`,
    );
  });

  // Child processes are slow on a loaded machine: a longer timeout than the suite's.
  it('--from writes what changed since the migrations: new, altered, redefined in place (its chain follows), dropped; nothing when nothing changed', {
    timeout: 240_000,
  }, async () => {
    const dir = await project();
    // A database of its own: the test below expects one with none of this.
    const own = await freshDatabase();
    const env = { DATABASE_URL: own.url };
    const kit = (cwd: string, args: string[]) => exec(cwd, [drizzleKit, ...args], env);
    const out = join(dir, 'migrations');
    expect((await trellis(dir, ['generate', 'install'])).code).toBe(0);
    expect((await kit(dir, ['generate', '--name', 'tables'])).code).toBe(0);
    const generate = (...args: string[]) =>
      trellis(dir, ['generate', 'transform', '--from', 'transforms.ts', ...args], env);
    const sqlFiles = async () => (await readdir(out)).filter((f) => f.endsWith('.sql')).sort();
    // The file, byte for byte: the two header lines, then each statement's line.
    const header = (await readFile(join(repo, 'package.json'), 'utf8')).match(
      /"version": "([^"]+)"/,
    )?.[1];
    const body = async (file: string) =>
      (await readFile(join(out, file), 'utf8')).split('--> statement-breakpoint\n');
    const first0 = (line: string) =>
      `-- Written by \`trellis generate transform\` (trellis-pg ${header}): Trellis statements,\n-- applied in drizzle-kit migrate's transaction. Install Trellis's schema in an earlier migration.\n${line}`;
    const apply = (statement: string) =>
      `SELECT "trellis".apply('${statement.replaceAll("'", "''")}');`;

    await writeFile(join(dir, 'transforms.ts'), transforms({ extraColumn: false, minimum: 0 }));
    const first = await generate();
    expect(first).toMatchObject({ code: 0, err: '' });
    expect(first.out).toBe(
      'Wrote migrations/0002_trellis_transform_big_orders_and_2_more.sql: drizzle-kit migrate applies it\n+ big_orders\n+ customer_spend\n+ spend_tiers\n',
    );
    expect(await body('0002_trellis_transform_big_orders_and_2_more.sql')).toEqual([
      first0(apply(BIG_ORDERS)),
      apply(customerSpend(0)),
      apply(SPEND_TIERS),
    ]);
    // The snapshot beside drizzle-kit's: drizzle-kit still finds nothing to do.
    expect(JSON.parse(await readFile(join(out, 'meta', '_trellis_snapshot.json'), 'utf8'))).toEqual(
      {
        version: 1,
        schema: 'trellis',
        transforms: {
          big_orders: { statement: BIG_ORDERS, reads: [] },
          customer_spend: { statement: customerSpend(0), reads: [] },
          spend_tiers: { statement: SPEND_TIERS, reads: ['customer_spend'] },
        },
      },
    );
    expect((await kit(dir, ['generate', '--name', 'nothing'])).out).toContain('No schema changes');

    // Unchanged: nothing written; --check agrees.
    const journal = () => readFile(join(out, 'meta', '_journal.json'), 'utf8');
    const before = await journal();
    expect(await generate()).toMatchObject({
      code: 0,
      out: 'No transform changes: nothing written\n',
    });
    expect(await journal()).toBe(before);
    expect((await generate('--check')).code).toBe(0);
    expect((await kit(dir, ['migrate'])).code).toBe(0);

    // A column added (ALTER … ADD COLUMN), a filter changed (redefined in place: ALTER
    // TRANSFORM … AS; the chain reading it follows on its own).
    await writeFile(join(dir, 'transforms.ts'), transforms({ extraColumn: true, minimum: 10 }));
    const check = await generate('--check');
    expect(check).toMatchObject({
      code: 1,
      err: 'trellis: transforms.ts and the migrations disagree on big_orders, customer_spend: run trellis generate transform --from transforms.ts\n',
    });
    const second = await generate();
    expect(second).toMatchObject({ code: 0, err: '' });
    expect(second.out).toBe(
      'Wrote migrations/0003_trellis_alter_add_column_big_orders_and_1_more.sql: drizzle-kit migrate applies it\n~ big_orders\n± customer_spend\n',
    );
    expect(await body('0003_trellis_alter_add_column_big_orders_and_1_more.sql')).toEqual([
      first0(
        apply(`ALTER TRANSFORM "big_orders" ADD COLUMN "orders"."customer_id" AS "customerId"`),
      ),
      apply(redefinition(customerSpend(10))),
    ]);
    expect((await kit(dir, ['migrate'])).code).toBe(0);
    const columns = await own.sql`
      SELECT c.name FROM trellis.transform_columns c JOIN trellis.transforms t ON t.id = c.transform_id
       WHERE t.target_name = 'big_orders' ORDER BY c.ordinal`;
    expect(columns.map((c) => c.name)).toEqual(['id', 'amount', 'customerId']);
    // Being redefined (no worker runs here to switch to it): the new definition recorded.
    const [spend] = await own.sql`
      SELECT redefinition->>'statement' AS statement FROM trellis.transforms
       WHERE target_name = 'customer_spend'`;
    expect(spend?.statement).toContain(`"orders"."amount" > '10'`);

    // Removed: refused without --allow-drop (nothing written), dropped with it.
    await writeFile(
      join(dir, 'transforms.ts'),
      transforms({ extraColumn: true, minimum: 10, withoutBigOrders: true }),
    );
    const refused = await generate();
    expect(refused.code).toBe(2);
    expect(refused.err).toBe(
      'trellis: the schema file no longer declares big_orders: pass --allow-drop to write DROP TRANSFORM for it (the target is dropped, rows and all) (validation)\n',
    );
    expect(await sqlFiles()).toHaveLength(4);
    const dropped = await generate('--allow-drop');
    expect(dropped.code).toBe(0);
    expect(await body('0004_trellis_drop_big_orders.sql')).toEqual([
      first0(apply('DROP TRANSFORM "big_orders"')),
    ]);
    expect((await kit(dir, ['migrate'])).code).toBe(0);
    const left =
      await own.sql`SELECT target_name FROM trellis.transforms WHERE redefines IS NULL ORDER BY 1`;
    expect(left.map((r) => r.target_name)).toEqual(['customer_spend', 'spend_tiers']);

    // A folder whose migrations predate the snapshot: it is made from them.
    await rm(join(out, 'meta', '_trellis_snapshot.json'));
    expect(await generate('--check')).toMatchObject({ code: 0 });
    expect(await generate()).toMatchObject({
      code: 0,
      out: 'No transform changes: nothing written\n',
    });
  });

  it("--from follows the drizzle config's casing (or --casing), as drizzle-kit names the tables", {
    timeout: 240_000,
  }, async () => {
    // Columns declared without a name, and casing: 'snake_case' in drizzle.config.ts:
    // drizzle-kit makes placed_by; the transform, which names no casing, must read it and
    // name its own column the same way.
    const dir = await mkdtemp(join(tmpdir(), 'trellis-generate-'));
    dirs.push(dir);
    await symlink(join(repo, 'node_modules'), join(dir, 'node_modules'));
    await writeFile(
      join(dir, 'schema.ts'),
      `import { integer, numeric, pgTable } from 'drizzle-orm/pg-core';
export const sales = pgTable('sales', { id: integer().primaryKey(), placedBy: integer().notNull(), amount: numeric().notNull() });
`,
    );
    await writeFile(
      join(dir, 'drizzle.config.ts'),
      CONFIG.replace("out: './migrations',", "out: './migrations',\n  casing: 'snake_case',"),
    );
    await writeFile(
      join(dir, 'transforms.ts'),
      `import { sql } from 'drizzle-orm';
import { transform } from ${JSON.stringify(BUILDER)};
import { sales } from './schema.ts';
export const bySeller = transform('sales_by_seller', (t) =>
  t.from(sales)
    .select({ placedBy: sales.placedBy, totalAmount: sql<string>\`sum(\${sales.amount})\` })
    .groupBy(sales.placedBy),
);
`,
    );
    const own = await freshDatabase();
    const env = { DATABASE_URL: own.url };
    const kit = (args: string[]) => exec(dir, [drizzleKit, ...args], env);
    const generate = (...args: string[]) =>
      trellis(dir, ['generate', 'transform', '--from', 'transforms.ts', ...args], env);
    expect((await trellis(dir, ['generate', 'install'])).code).toBe(0);
    expect((await kit(['generate', '--name', 'tables'])).code).toBe(0);
    const written = await generate();
    expect(written).toMatchObject({ code: 0, err: '' });
    const statement =
      'TRANSFORM "sales_by_seller"\nFROM "sales"\nSELECT "sales"."placed_by" AS "placed_by", sum("sales"."amount") AS "total_amount"\nGROUP BY "sales"."placed_by"';
    const snapshot = JSON.parse(
      await readFile(join(dir, 'migrations', 'meta', '_trellis_snapshot.json'), 'utf8'),
    );
    expect(snapshot.transforms.sales_by_seller.statement).toBe(statement);
    // drizzle-kit migrate applies it: the target has the config's column names.
    expect((await kit(['migrate'])).code).toBe(0);
    const columns = await own.sql`
      SELECT column_name FROM information_schema.columns
       WHERE table_schema = 'public' AND table_name = 'sales_by_seller' ORDER BY ordinal_position`;
    expect(columns.map((c) => c.column_name)).toEqual(['placed_by', 'total_amount']);
    // --casing names it on the command line, over the config's.
    expect((await generate('--check', '--casing', 'snake_case')).code).toBe(0);
    expect((await generate('--check', '--casing', 'camelCase')).code).toBe(1);
    expect(await generate('--check', '--casing', 'kebab')).toMatchObject({
      code: 2,
      err: 'trellis: --casing is snake_case or camelCase, not kebab (validation)\n',
    });
    // And the app reads the target through a drizzle() made with the same casing: its
    // columns, declared without a name, are named by it (no casing: by their keys).
    const { bySeller } = (await import(join(dir, 'transforms.ts'))) as { bySeller: unknown };
    const snake = drizzle.mock({ casing: 'snake_case' });
    expect(
      snake
        .select()
        .from(bySeller as never)
        .toSQL().sql,
    ).toBe('select "placed_by", "total_amount" from "sales_by_seller"');
    expect(
      drizzle
        .mock()
        .select()
        .from(bySeller as never)
        .toSQL().sql,
    ).toBe('select "placedBy", "totalAmount" from "sales_by_seller"');
  });

  it('checks statements first, then writes migrations drizzle-kit migrate applies', {
    timeout: 150_000,
  }, async () => {
    const dir = await project();
    const env = { DATABASE_URL: db.url };
    expect((await trellis(dir, ['generate', 'install'])).code).toBe(0);
    expect((await kit(dir, ['generate', '--name', 'tables'])).code).toBe(0);
    const journal = () => readFile(join(dir, 'migrations', 'meta', '_journal.json'), 'utf8');
    const before = await journal();

    // Refused statements write nothing: a parse error points at the position, a name
    // Postgres does not know is refused as the migration would be (the pending migrations
    // that create the tables ran first, in a transaction that was rolled back). These run
    // in this process (the command's logic; the child processes above and below are how a
    // user runs it).
    const config = ['--config', join(dir, 'drizzle.config.ts'), '--out', join(dir, 'migrations')];
    const parse = await inProcess(
      ['generate', 'transform', 'TRANSFORM t FROM orders SELEC amount', ...config],
      env,
    );
    // Exit 2: a refused statement (the CLI's exit codes, see README).
    expect(parse.code).toBe(2);
    expect(parse.err).toMatch(
      /^trellis: expected JOIN or SELECT, found "amount" at character 31 \(parse\)\n$/,
    );
    const misspelt = await inProcess(
      ['generate', 'transform', 'TRANSFORM t FROM orders SELECT amuont AS amount', ...config],
      env,
    );
    expect(misspelt.code).toBe(2);
    expect(misspelt.err).toMatch(/amuont.*\(validation\)\n$/);
    // A view's SQL (the AS form) is checked the same way: what it may not hold, by name.
    const union = await inProcess(
      [
        'generate',
        'transform',
        'TRANSFORM t AS SELECT amount, lag(amount) OVER (ORDER BY amount) AS prev FROM orders',
        ...config,
      ],
      env,
    );
    expect(union.code).toBe(2);
    expect(union.err).toMatch(/a window function \(lag\(\) OVER .*\(validation\)\n$/);
    const noUrl = await inProcess(
      ['generate', 'transform', 'DROP TRANSFORM t', '--out', join(dir, 'migrations')],
      {},
    );
    expect(noUrl.err).toMatch(/checks statements on a database.*\(validation\)/);
    expect(await journal()).toBe(before);
    const [untouched] =
      await db.sql`SELECT to_regnamespace('trellis') AS ns, to_regclass('orders') AS t`;
    expect(untouched).toEqual({ ns: null, t: null });

    const statement = 'TRANSFORM big_orders FROM orders SELECT amount AS amount WHERE amount > 100';
    const written = await trellis(dir, ['generate', 'transform', statement], env);
    expect(written).toMatchObject({ code: 0, err: '' });
    expect(written.out).toContain('migrations/0002_trellis_transform_big_orders.sql');
    const file = await readFile(
      join(dir, 'migrations', '0002_trellis_transform_big_orders.sql'),
      'utf8',
    );
    expect(file.split('\n').filter((l) => !l.startsWith('--'))).toEqual([
      `SELECT "trellis".apply('${statement}');`,
    ]);

    const migrated = await kit(dir, ['migrate']);
    expect(migrated.code).toBe(0);
    const transforms = await db.sql`SELECT target_name FROM trellis.transforms`;
    expect(transforms).toEqual([{ target_name: 'big_orders' }]);

    // Up to date: upgrade writes nothing; install again is refused.
    const upgrade = await inProcess(['generate', 'upgrade', ...config], {});
    expect(upgrade.out).toContain('nothing written');
    const install = await inProcess(['generate', 'install', ...config], {});
    expect(install).toMatchObject({ code: 6 });
    expect(install.err).toMatch(/already installs.*\(conflict\)/);

    // On a database where the pending migrations cannot run (its tables were made
    // another way), only the grammar is checked, and the note says so.
    const other = await freshDatabase();
    await other.sql.unsafe('CREATE TABLE customers (id int PRIMARY KEY)');
    const grammarOnly = await inProcess(
      ['generate', 'transform', 'DROP TRANSFORM big_orders', ...config],
      {
        DATABASE_URL: other.url,
      },
    );
    expect(grammarOnly.code).toBe(0);
    expect(grammarOnly.err).toMatch(/^trellis: note: .*only the grammar was checked\n$/);
  });

  it("writes upgrades with only the schema migrations after the folder's last Trellis migration", {
    timeout: 150_000,
  }, async () => {
    const dir = await project();
    const out = join(dir, 'migrations');
    const config = ['--config', join(dir, 'drizzle.config.ts'), '--out', out];
    // An install an older trellis-pg wrote: its schema three versions behind.
    const from = latestVersion() - 3;
    const older = migrations.filter((m) => m.version <= from);
    writeCustomMigration({ out, breakpoints: true, prefix: 'index' }, 'trellis_install', [
      installSql({ schema: 'trellis', targetSchema: 'public', migrations: older }),
    ]);
    const upgrade = await inProcess(['generate', 'upgrade', ...config], {});
    expect(upgrade).toMatchObject({ code: 0, err: '' });
    const file = join(out, `0001_trellis_upgrade_v${latestVersion()}.sql`);
    const text = await readFile(file, 'utf8');
    expect(text.split('\n')[1]).toBe(
      `-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version ${from} to version ${latestVersion()}.`,
    );
    for (const m of older) expect(text).not.toContain(`WHERE version = ${m.version})`);
    // The next upgrade starts where this one ends: nothing to write.
    const again = await inProcess(['generate', 'upgrade', ...config], {});
    expect(again.out).toContain('nothing written');
    // --from says where a database stands when the folder cannot.
    const bad = await inProcess(['generate', 'upgrade', '--from', 'x', ...config], {});
    expect(bad).toMatchObject({ code: 2 });

    // drizzle-kit migrate runs both, in order, on a fresh database.
    const fresh = await freshDatabase();
    const migrated = await exec(dir, [drizzleKit, 'migrate'], { DATABASE_URL: fresh.url });
    expect(migrated.code, migrated.err + migrated.out).toBe(0);
    const [version] = await fresh.sql`SELECT max(version)::int AS v FROM trellis.migrations`;
    expect(version?.v).toBe(latestVersion());
  });
});
