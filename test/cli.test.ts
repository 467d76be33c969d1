import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { runCli } from '../src/cli/run.js';
import { migrations } from '../src/engine/schema/migrations.generated.js';
import { latestVersion } from '../src/migration/index.js';
import { trellisCli } from './support/cli.js';
import { freshDatabase } from './support/database.js';

// The CLI as a user runs it: a child process, through tsx (the built bin is tested by
// package.test.ts against the packed tarball).
const trellis = trellisCli;

const version = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;

// Each command is a process of its own, compiled by tsx on start: slow on a loaded machine.
describe('trellis CLI', { timeout: 180_000 }, () => {
  it('prints help with every command, and exits 0', async () => {
    const result = await trellis(['--help']);
    expect(result).toMatchObject({ code: 0, stderr: '' });
    expect(result.stdout).toContain('Usage: trellis <command>');
    expect(result.stdout).toContain('sql install');
    expect(result.stdout).toContain('migrate');
    const command = await trellis(['migrate', '--help']);
    expect(command.code).toBe(0);
    expect(command.stdout).toContain('--url');
  });

  it('prints its version and the catalog schema version it needs', async () => {
    expect(await trellis(['--version'])).toEqual({
      code: 0,
      stdout: `${version} (catalog schema version ${latestVersion()})\n`,
      stderr: '',
    });
  });

  it('prints help for every command and command group with --help, and exits 0', async () => {
    // In this process (runCli): a child process per command is slow on a loaded machine.
    const run = async (argv: string[]) => {
      let out = '';
      let err = '';
      const code = await runCli(argv, { out: (t) => (out += t), err: (t) => (err += t), env: {} });
      return { code, out, err };
    };
    const top = await run(['--help']);
    const listed = top.out
      .split('Commands:\n')[1]!
      .split('\n\n')[0]!
      .split('\n')
      .map((line) => line.trim().split(/ {2,}/)[0]!);
    expect(listed).toContain('generate upgrade');
    const groups = [...new Set(listed.filter((n) => n.includes(' ')).map((n) => n.split(' ')[0]!))];
    expect(groups.sort()).toEqual(['generate', 'sql']);
    for (const name of listed) {
      const help = await run([...name.split(' '), '--help']);
      expect(help, name).toMatchObject({ code: 0, err: '' });
      expect(help.out, name).toContain(`trellis ${name}`);
    }
    for (const group of groups) {
      for (const flag of ['--help', '-h', 'help']) {
        const help = await run([group, flag]);
        expect(help, `${group} ${flag}`).toMatchObject({ code: 0, err: '' });
        expect(help.out).toContain(`Usage: trellis ${group} <subcommand>`);
        for (const name of listed.filter((n) => n.startsWith(`${group} `))) {
          expect(help.out).toContain(name);
        }
      }
    }
    // Without --help, a group still asks for its subcommand (exit 2).
    expect((await run(['generate'])).code).toBe(2);
  });

  it('refuses unknown commands and options with a validation error', async () => {
    const unknown = await trellis(['frobnicate']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^trellis: unknown command "frobnicate".* \(validation\)\n$/);
    const option = await trellis(['sql', 'install', '--bogus']);
    expect(option.code).toBe(2);
    expect(option.stderr).toMatch(/^trellis: .*--bogus.* \(validation\)\n$/);
    expect(option.stdout).toBe('');
  });

  it('prints install SQL that installs the schema once however often it runs', async () => {
    const result = await trellis(['sql', 'install']);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('CREATE SCHEMA IF NOT EXISTS "trellis"');
    const db = await freshDatabase();
    await db.sql.unsafe(result.stdout);
    await db.sql.unsafe(result.stdout);
    const [ns] =
      await db.sql`SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = 'trellis'`;
    expect(ns?.n).toBe(1);
    const rows = await db.sql`SELECT version FROM trellis.migrations ORDER BY version`;
    expect(rows.map((r) => r.version)).toEqual(migrations.map((m) => m.version));
    const [config] = await db.sql`SELECT target_schema FROM trellis.config`;
    expect(config?.target_schema).toBe('public');
  });

  it('prints install SQL for another schema and target schema', async () => {
    const result = await trellis([
      'sql',
      'install',
      '--schema',
      'tr cat',
      '--target-schema',
      'derived',
    ]);
    expect(result.code).toBe(0);
    const db = await freshDatabase();
    await db.sql`CREATE SCHEMA derived`;
    await db.sql.unsafe(result.stdout);
    const [config] = await db.sql`SELECT target_schema FROM "tr cat".config`;
    expect(config?.target_schema).toBe('derived');
  });

  it('migrates a fresh database, then finds it up to date', async () => {
    const db = await freshDatabase();
    const first = await trellis(['migrate', '--url', db.url]);
    expect(first).toMatchObject({ code: 0, stderr: '' });
    expect(first.stdout).toBe(
      `Trellis schema "trellis": from version 0 to version ${latestVersion()} (migrated)\n`,
    );
    // The URL may come from DATABASE_URL.
    const second = await trellis(['migrate'], { DATABASE_URL: db.url });
    expect(second.code).toBe(0);
    expect(second.stdout).toContain(
      `from version ${latestVersion()} to version ${latestVersion()} (already up to date)`,
    );
    const [row] = await db.sql`SELECT count(*)::int AS n FROM trellis.migrations`;
    expect(row?.n).toBe(migrations.length);
  });

  it('needs a URL to migrate', async () => {
    const result = await trellis(['migrate']);
    expect(result.code).toBe(2);
    expect(result.stderr).toBe(
      'trellis: migrate needs --url <postgres url> or DATABASE_URL (validation)\n',
    );
  });

  it('exits 4 with a connection error when the server cannot be reached', async () => {
    const result = await trellis(['migrate', '--url', 'postgres://postgres@127.0.0.1:1/nowhere']);
    expect(result.code).toBe(4);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(
      /^trellis: cannot connect to .*127\.0\.0\.1:1.* \(connection\)\n$/,
    );
  });
});
