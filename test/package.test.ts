import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildState } from './support/build-state.js';

// Tests what ships: packs the package (built by the suite's setup), installs the tarball
// into an empty ESM project, and uses it there the way an app would, through its `exports`
// and its bin.
const run = promisify(execFile);
const repo = resolve(import.meta.dirname, '..');
const SLOW = 300_000;

/** The environment of a child npm: without the package context of the `npm test` running us. */
function childEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (key.startsWith('npm_package_') || key.startsWith('npm_lifecycle_')) continue;
    if (key === 'INIT_CWD' || key === 'npm_config_prefix') continue;
    env[key] = value;
  }
  return env;
}

async function sh(
  file: string,
  args: string[],
  cwd: string,
): Promise<{ stdout: string; stderr: string }> {
  try {
    return await run(file, args, {
      cwd,
      env: childEnv(),
      timeout: SLOW,
      maxBuffer: 32 * 1024 * 1024,
    });
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `${file} ${args.join(' ')} failed in ${cwd}:\n${e.stderr ?? ''}${e.stdout ?? ''}`,
      {
        cause: error,
      },
    );
  }
}

function devDependency(name: string): string {
  const pkg = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as {
    devDependencies: Record<string, string>;
  };
  const version = pkg.devDependencies[name];
  if (!version) throw new Error(`${name} is not a dev dependency`);
  return version;
}

const dirs: string[] = [];
let project = '';

beforeAll(async () => {
  const packDir = await mkdtemp(join(tmpdir(), 'trellis-pack-'));
  project = await mkdtemp(join(tmpdir(), 'trellis-consumer-'));
  dirs.push(packDir, project);
  // The suite's setup (test/support/build-setup.ts) built dist/ from this src/ before any
  // file ran; building again here would rewrite dist/ under the files that import it now.
  if (buildState() !== 'current') throw new Error('dist/ is not built from src/: npm run build');
  await sh('npm', ['pack', '--pack-destination', packDir], repo);
  const [tarball] = (await readdir(packDir)).filter((f) => f.endsWith('.tgz'));
  if (!tarball) throw new Error(`npm pack wrote no tarball into ${packDir}`);
  await sh('npm', ['init', '-y'], project);
  const pkgPath = join(project, 'package.json');
  const pkg = JSON.parse(await readFile(pkgPath, 'utf8')) as Record<string, unknown>;
  await writeFile(pkgPath, JSON.stringify({ ...pkg, type: 'module' }, null, 2));
  // drizzle-orm is an optional peer dependency, of trellis-pg/drizzle only: installed here
  // as a Drizzle app has it, at the version this repository tests.
  const drizzle = `drizzle-orm@${devDependency('drizzle-orm')}`;
  await sh(
    'npm',
    ['install', join(packDir, tarball), drizzle, '--no-audit', '--no-fund', '--prefer-offline'],
    project,
  );
}, SLOW);

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe('the packed package, installed in an empty project', { timeout: SLOW }, () => {
  it('ships only the build output and the README', async () => {
    const installed = join(project, 'node_modules', 'trellis-pg');
    const top = (await readdir(installed)).sort();
    expect(top).toEqual(['README.md', 'dist', 'package.json'].sort());
    const dist = await readdir(join(installed, 'dist'));
    expect(dist).toEqual(
      expect.arrayContaining(['cli', 'drizzle', 'engine', 'migration', 'testing']),
    );
  });

  it('imports every subpath export with node', async () => {
    await writeFile(
      join(project, 'check.mjs'),
      `
import { Trellis, TrellisError, TRELLIS_ERROR_CODES, DEFAULTS } from 'trellis-pg';
import { applyStatementSql, statementOf, transform } from 'trellis-pg/drizzle';
import { installSql, latestVersion } from 'trellis-pg/migration';
import { startPostgres } from 'trellis-pg/testing';
import { OPS_ACTIONS, opsHandler } from 'trellis-pg/ops';
import { integer, pgTable } from 'drizzle-orm/pg-core';
const things = pgTable('things', { id: integer().primaryKey(), n: integer() });
const target = transform('thing_ns', (t) => t.from(things).select({ n: things.n }));
const error = new TrellisError('parse', 'x');
console.log(JSON.stringify({
  connect: typeof Trellis.connect,
  trellisError: error instanceof Error && error.code === 'parse',
  codes: TRELLIS_ERROR_CODES.includes('connection'),
  schema: DEFAULTS.schema,
  apply: applyStatementSql("TRANSFORM t FROM s SELECT 'a' AS a"),
  install: installSql().includes('CREATE SCHEMA IF NOT EXISTS "trellis"'),
  latest: latestVersion(),
  startPostgres: typeof startPostgres,
  opsHandler: typeof opsHandler,
  opsActions: OPS_ACTIONS,
  statement: statementOf(target),
}));
`,
    );
    const { stdout } = await sh('node', ['check.mjs'], project);
    const seen = JSON.parse(stdout) as Record<string, unknown>;
    expect(seen).toMatchObject({
      connect: 'function',
      trellisError: true,
      codes: true,
      schema: 'trellis',
      apply: `SELECT "trellis".apply('TRANSFORM t FROM s SELECT ''a'' AS a');`,
      install: true,
      startPostgres: 'function',
      opsHandler: 'function',
      opsActions: ['pause', 'resume', 'release', 'selfCheck'],
      statement: 'TRANSFORM "thing_ns"\nFROM "things"\nSELECT "things"."n" AS "n"',
    });
    expect(seen.latest).toBeGreaterThan(0);
  });

  it('requires every subpath export from CommonJS (require of ESM, Node 20.19+), types included', async () => {
    // A project of npm init's default "type": "commonjs": .cjs and .cts files say it too.
    await writeFile(
      join(project, 'check.cjs'),
      `
const { Trellis, TrellisError, serveMetrics } = require('trellis-pg');
const { transform, statementOf } = require('trellis-pg/drizzle');
const { installSql, upgradeSql, latestVersion } = require('trellis-pg/migration');
const { startPostgres } = require('trellis-pg/testing');
const { opsHandler } = require('trellis-pg/ops');
const { integer, pgTable } = require('drizzle-orm/pg-core');
const things = pgTable('things', { id: integer().primaryKey(), n: integer() });
async function main() {
  console.log(JSON.stringify({
    connect: typeof Trellis.connect,
    error: new TrellisError('parse', 'x').code,
    serveMetrics: typeof serveMetrics,
    statement: statementOf(transform('thing_ns', (t) => t.from(things).select({ n: things.n }))),
    install: installSql().includes('CREATE SCHEMA IF NOT EXISTS "trellis"'),
    upgrade: upgradeSql({ from: latestVersion() - 1 }).includes('from version'),
    startPostgres: typeof startPostgres,
    opsHandler: typeof opsHandler,
  }));
}
main();
`,
    );
    const { stdout } = await sh('node', ['check.cjs'], project);
    expect(JSON.parse(stdout)).toEqual({
      connect: 'function',
      error: 'parse',
      serveMetrics: 'function',
      statement: 'TRANSFORM "thing_ns"\nFROM "things"\nSELECT "things"."n" AS "n"',
      install: true,
      upgrade: true,
      startPostgres: 'function',
      opsHandler: 'function',
    });
    await writeFile(
      join(project, 'check-cjs.cts'),
      `
import { Trellis, type ConnectOptions } from 'trellis-pg';
import { installSql } from 'trellis-pg/migration';
const options: ConnectOptions = { url: 'postgres://localhost/app' };
async function main(): Promise<string> {
  const trellis = await Trellis.connect(options);
  try {
    return (await trellis.config()).targetSchema + installSql().length;
  } finally {
    await trellis.shutdown();
  }
}
export = main;
`,
    );
    await writeFile(
      join(project, 'tsconfig.cjs.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          lib: ['ES2022'],
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          strict: true,
          noEmit: true,
          skipLibCheck: false,
          typeRoots: [join(repo, 'node_modules', '@types')],
          types: ['node'],
        },
        files: ['check-cjs.cts'],
      }),
    );
    await sh(join(repo, 'node_modules', '.bin', 'tsc'), ['-p', 'tsconfig.cjs.json'], project);
  });

  it('runs the trellis bin', async () => {
    const help = await sh('npx', ['trellis', '--help'], project);
    expect(help.stdout).toContain('Usage: trellis <command>');
    const install = await sh('npx', ['trellis', 'sql', 'install'], project);
    expect(install.stdout).toContain('CREATE SCHEMA IF NOT EXISTS "trellis"');
  });

  it('type-checks code importing every subpath (the exports types conditions)', async () => {
    await writeFile(
      join(project, 'check.ts'),
      `
import { Trellis, TrellisError, type ConnectOptions, type TrellisErrorCode } from 'trellis-pg';
import { installSql, type InstallSqlOptions, latestVersion } from 'trellis-pg/migration';
import { startPostgres, type TestPostgres } from 'trellis-pg/testing';
import { type OpsAuthorize, type OpsRequestHandler, opsHandler } from 'trellis-pg/ops';

const authorize: OpsAuthorize = (request, action) => action !== 'release' && request.method === 'POST';
const mountOps = (trellis: Trellis): OpsRequestHandler => opsHandler({ trellis, authorize });
// @ts-expect-error actions are a closed union
const badAction: OpsAuthorize = (_request, action) => action === 'drop';

const options: ConnectOptions = { url: 'postgres://localhost/app', staging: false };
const connect: (o: ConnectOptions) => Promise<Trellis> = Trellis.connect;
const code: TrellisErrorCode = new TrellisError('timeout', 'late').code;
const install: InstallSqlOptions = { schema: 'trellis', targetSchema: 'public' };
const sql: string = installSql(install);
const version: number = latestVersion();
const start: () => Promise<TestPostgres> = () => startPostgres();
async function configOf(url: string) {
  await using trellis = await Trellis.connect({ url });
  return (await trellis.config()).targetSchema;
}
// The types are real, not \`any\`: each of these must be an error.
// @ts-expect-error code is a closed union
const bad: TrellisErrorCode = 'no_such_code';
// @ts-expect-error url is required
const missing: ConnectOptions = {};
export { bad, badAction, code, configOf, connect, install, missing, mountOps, options, sql, start, version };
`,
    );
    const types = join(repo, 'node_modules', '@types');
    await writeFile(
      join(project, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          // What a plain Node 20 project has: @types/node supplies AsyncDisposable.
          lib: ['ES2022'],
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          strict: true,
          noEmit: true,
          // The shipped .d.ts files must compile too.
          skipLibCheck: false,
          typeRoots: [types],
          types: ['node'],
        },
        files: ['check.ts'],
      }),
    );
    await sh(join(repo, 'node_modules', '.bin', 'tsc'), ['-p', 'tsconfig.json'], project);
  });

  it('type-checks code using trellis-pg/drizzle with drizzle-orm', async () => {
    await writeFile(
      join(project, 'check-drizzle.ts'),
      `
import { integer, pgTable } from 'drizzle-orm/pg-core';
import { applyStatementSql, statementOf, transform } from 'trellis-pg/drizzle';

const things = pgTable('things', { id: integer().primaryKey(), n: integer() });
const target = transform('thing_ns', (t) => t.from(things).select({ n: things.n }));
const sql: string = applyStatementSql(statementOf(target));
const row: (typeof target)['$inferSelect'] = { n: null };
// @ts-expect-error n is a number or null
const wrongRow: (typeof target)['$inferSelect'] = { n: 'x' };
export { row, sql, wrongRow };
`,
    );
    // drizzle-orm's own declaration files do not compile without skipLibCheck (they name
    // drivers that are not installed), so this check skips library files.
    await writeFile(
      join(project, 'tsconfig.drizzle.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          lib: ['ES2022'],
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          strict: true,
          noEmit: true,
          skipLibCheck: true,
          typeRoots: [join(repo, 'node_modules', '@types')],
          types: ['node'],
        },
        files: ['check-drizzle.ts'],
      }),
    );
    await sh(join(repo, 'node_modules', '.bin', 'tsc'), ['-p', 'tsconfig.drizzle.json'], project);
  });
});
