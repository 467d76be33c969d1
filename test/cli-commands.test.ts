import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runCli } from '../src/cli/run.js';
import { latestVersion } from '../src/engine/schema/install-sql.js';
import { trellisInProcess as trellisCli } from './support/cli.js';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// The operator's commands as a script uses them: --json parsed, exit statuses checked. In
// this process (runCli): test/cli.test.ts runs the CLI as a process of its own.

const prices: Definition = {
  target: 'prices',
  from: 'items',
  select: '100 / d AS ratio',
  implicit: 'id',
};

describe('trellis apply, definitions, status, quarantine, release', { timeout: 180_000 }, () => {
  it('defines, reports, and releases a held key, for scripts and people', async () => {
    const db = await freshDatabase();
    await db.sql`CREATE TABLE items (id int PRIMARY KEY, d int NOT NULL)`;
    await db.sql`INSERT INTO items SELECT g, CASE WHEN g = 42 THEN 0 ELSE g END FROM generate_series(1, 100) g`;
    await using trellis = await migratedTrellis(db);
    const url = ['--url', db.url];

    const defined = await trellisCli(['apply', ...url, '--json', transformStatement(prices)]);
    expect(defined.code).toBe(0);
    expect(JSON.parse(defined.stdout)).toEqual({ kind: 'transform_defined', target: 'prices' });

    const refused = await trellisCli(['apply', ...url, 'TRANSFORM prices FROM']);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/\(parse\)\n$/);

    const listed = await trellisCli(['definitions', '--json'], { DATABASE_URL: db.url });
    expect(listed.code).toBe(0);
    const [definition] = JSON.parse(listed.stdout);
    expect(definition).toMatchObject({ target: 'prices', sources: [{ table: 'public.items' }] });
    expect(definition.statement).toMatch(/^TRANSFORM prices FROM public\.items SELECT/);

    // Workers in this process: the key of item 42 fails (division by zero) and is held.
    await using worker = await migratedTrellis(db, { staging: true, drainThreads: 1 });
    await waitForStatus(worker, 'prices', 'live');
    await waitFor(async () => (await worker.status('prices')).heldKeys === 1, 'a held key');

    const status = await trellisCli(['status', ...url, '--json']);
    expect(status.code).toBe(0);
    expect(JSON.parse(status.stdout)).toEqual([
      expect.objectContaining({ target: 'prices', status: 'live', heldKeys: 1 }),
    ]);
    // Piped: a plain table, no terminal codes.
    const table = await trellisCli(['status', ...url, 'prices']);
    expect(table.code).toBe(0);
    expect(table.stdout).not.toContain('\x1b');
    expect(table.stdout.split('\n')[0]).toMatch(/^TARGET\s+STATUS\s+LAG\s+HELD\s+PAUSES/);
    expect(table.stdout.split('\n')[1]).toMatch(/^prices\s+live\s+-\s+1\s/);
    // Under the table: the workers, and each process running them with its versions.
    await waitFor(
      async () => (await worker.workers()).staging.passing === true,
      'the staging worker reporting',
    );
    const withWorkers = await trellisCli(['status', ...url]);
    expect(withWorkers.stdout).toMatch(
      /^staging worker: elected on \S+ pid \d+ \(trellis-pg \d+\.\d+\.\d+[^)]*\), passing, last pass \d+ s ago$/m,
    );
    expect(withWorkers.stdout).toMatch(/^drain loops: 1 running, /m);
    expect(withWorkers.stdout).toContain(`processes (schema ${latestVersion()} installed):`);
    expect(withWorkers.stdout).toMatch(
      new RegExp(
        `^  \\S+ pid ${process.pid}  trellis-pg \\S+  schema ${latestVersion()}  staging \\+ 1 drain loop$`,
        'm',
      ),
    );

    const entries = await trellisCli(['quarantine', ...url, '--json']);
    expect(JSON.parse(entries.stdout)).toEqual([
      expect.objectContaining({ address: 'prices.ratio', count: 1, paused: false }),
    ]);
    const page = await trellisCli(['quarantine', ...url, 'prices.ratio', '--limit', '1', '--json']);
    expect(JSON.parse(page.stdout)).toMatchObject({
      address: 'prices.ratio',
      count: 1,
      samples: [{ srcTable: 'public.items', key: '42', error: 'division by zero' }],
      nextCursor: null,
    });

    // Released before the cause is fixed: it fails again, and says so with status 8.
    const again = await trellisCli(['release', ...url, 'prices.ratio', 'public.items', '42']);
    expect(again.code).toBe(8);
    expect(again.stderr).toContain('held again at prices.ratio: division by zero');

    await db.sql`UPDATE items SET d = 5 WHERE id = 42`;
    const released = await trellisCli([
      'release',
      ...url,
      '--json',
      'prices.ratio',
      'public.items',
      '42',
    ]);
    expect(released.code).toBe(0);
    expect(JSON.parse(released.stdout)).toEqual({ released: true });
    expect((await trellis.status('prices')).heldKeys).toBe(0);
    await worker.awaitConverged('prices', await worker.watermarkToken());
    await expectMatchesDefinition(db.sql, prices);

    const missing = await trellisCli(['status', ...url, 'nope']);
    expect(missing.code).toBe(3);
    expect(missing.stderr).toBe('trellis: there is no transform named nope (not_found)\n');
  });

  it('has help for every command', async () => {
    const usage = await trellisCli(['--help']);
    const names = [...usage.stdout.matchAll(/^ {2}([a-z]+(?: [a-z]+)?) {2,}\S/gm)].map(
      (m) => m[1]!,
    );
    expect(names).toEqual(
      expect.arrayContaining([
        'status',
        'apply',
        'definitions',
        'quarantine',
        'release',
        'worker',
        'dump',
      ]),
    );
    for (const name of names) {
      const help = await trellisCli([...name.split(' '), '--help']);
      expect(help.code).toBe(0);
      expect(help.stdout).toMatch(new RegExp(`^Usage: trellis ${name} `));
    }
  });

  it('refuses a worker that would run nothing, and commands without a URL', async () => {
    const idle = await trellisCli([
      'worker',
      '--url',
      'postgres://x@127.0.0.1:1/x',
      '--no-staging',
      '--drain-threads',
      '0',
    ]);
    expect(idle).toMatchObject({ code: 2, stdout: '' });
    expect(idle.stderr).toContain('would run nothing');
    const noUrl = await trellisCli(['definitions']);
    expect(noUrl).toEqual({
      code: 2,
      stdout: '',
      stderr: 'trellis: definitions needs --url <postgres url> or DATABASE_URL (validation)\n',
    });
    const badCount = await trellisCli(['quarantine', '--limit', 'many']);
    expect(badCount.code).toBe(2);
    expect(badCount.stderr).toContain('see trellis quarantine --help');
  });

  it('names CLI commands in its messages, and makes the folders a path needs', async () => {
    const db = await freshDatabase();
    const uninstalled = await trellisCli(['definitions', '--url', db.url]);
    expect(uninstalled.code).toBe(5);
    expect(uninstalled.stderr).toContain('run `trellis migrate`');
    expect(uninstalled.stderr).not.toContain('migrate()');

    // trellis dump --file db/structure.sql in a project without db/.
    const dir = await mkdtemp(join(tmpdir(), 'trellis-dump-path-'));
    try {
      const file = join(dir, 'db', 'nested', 'structure.sql');
      expect((await trellisCli(['migrate', '--url', db.url])).code).toBe(0);
      // The pg_dump of this server where the machine has none (CI's Postgres 18 run).
      const pgDump = process.env.TRELLIS_PG_DUMP ? ['--pg-dump', process.env.TRELLIS_PG_DUMP] : [];
      const dumped = await trellisCli(['dump', '--url', db.url, '--file', file, ...pgDump]);
      expect(dumped, dumped.stderr).toMatchObject({ code: 0, stdout: '' });
      expect(await readFile(file, 'utf8')).toContain('CREATE SCHEMA');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('status --watch on a terminal without a width prints plain lines; the table names index gaps with both fixes', async () => {
    const db = await freshDatabase();
    await db.sql`CREATE TABLE w_items (id int PRIMARY KEY, n int NOT NULL)`;
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
    await trellis.apply('TRANSFORM w_copy FROM w_items SELECT n AS n');
    await waitForStatus(trellis, 'w_copy', 'live');
    let out = '';
    const drawn: string[] = [];
    // What a zero-width pseudo-terminal looks like to the command.
    const tty = {
      isTTY: true,
      columns: 0,
      rows: 0,
      write: (chunk: string) => drawn.push(chunk),
      on: () => tty,
      off: () => tty,
      once: () => tty,
      removeListener: () => tty,
    } as unknown as NodeJS.WriteStream;
    const code = await runCli(
      ['status', '--watch', '--until', 'live', '--url', db.url, '--interval', '50'],
      { out: (t) => (out += t), err: () => {}, env: {}, tty },
    );
    expect(code).toBe(0);
    expect(out).toMatch(/^\d{4}-\d\d-\d\dT\S+ w_copy live /m);
    expect(drawn.join('')).toBe('');

    // The table names a source index gap, with the fix for a migration and for psql.
    await trellis.apply('TRANSFORM w_by_n FROM w_items SELECT n, count(*) AS c GROUP BY n');
    const [gap] = (await trellis.status('w_by_n')).sourceIndexGaps;
    expect(gap?.fix).toMatch(/^CREATE INDEX CONCURRENTLY /);
    const table = await trellisCli(['status', '--url', db.url]);
    expect(table.code).toBe(0);
    expect(table.stdout).toContain(
      `w_by_n: public.w_items has no index on (n) (group by); in a migration: ${gap!.fix.replace('CONCURRENTLY ', '')} — from psql: ${gap!.fix}`,
    );
    // The migration's form runs inside a transaction, and closes the gap.
    await db.sql.begin((tx) => tx.unsafe(gap!.fix.replace('CONCURRENTLY ', '')));
    expect((await trellis.status('w_by_n')).sourceIndexGaps).toEqual([]);
  });
});
