import { execFile } from 'node:child_process';
import { cp, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildState } from './support/build-state.js';

// scripts/check-release.mjs, the release check CI runs: on this repository, and on copies
// where a release or a schema change has no changelog entry. With --pack it also packs the
// package and runs publint and @arethetypeswrong/cli on the tarball, offline: about 40 s on
// a loaded 2-core machine (npm pack and attw, a few seconds of CPU), run here so that a
// packaging break fails `npm test` too, not only CI's release step.
const repo = resolve(import.meta.dirname, '..');
const script = join(repo, 'scripts/check-release.mjs');
const dirs: string[] = [];

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

function check(
  root: string,
  ...flags: string[]
): Promise<{ code: number; out: string; err: string }> {
  return new Promise((done) =>
    execFile(process.execPath, [script, '--root', root, ...flags], (error, out, err) =>
      done({ code: error ? Number(error.code) : 0, out, err }),
    ),
  );
}

/** A copy of what the check reads: package.json, CHANGELOG.md and the migrations. */
async function copy(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'trellis-release-'));
  dirs.push(dir);
  await cp(join(repo, 'package.json'), join(dir, 'package.json'));
  await cp(join(repo, 'CHANGELOG.md'), join(dir, 'CHANGELOG.md'));
  await cp(join(repo, 'src/engine/schema/sql'), join(dir, 'src/engine/schema/sql'), {
    recursive: true,
  });
  return dir;
}

describe('the release check', () => {
  it('passes on this repository: its version and schema version are in the changelog', async () => {
    const result = await check(repo);
    expect(result).toMatchObject({ code: 0, err: '' });
    const pkg = JSON.parse(await readFile(join(repo, 'package.json'), 'utf8')) as {
      version: string;
    };
    expect(result.out).toContain(`trellis-pg ${pkg.version}`);
  });

  it('fails for a version without a changelog section', async () => {
    const dir = await copy();
    const pkgPath = join(dir, 'package.json');
    const pkg = JSON.parse(await readFile(pkgPath, 'utf8')) as Record<string, unknown>;
    await writeFile(pkgPath, JSON.stringify({ ...pkg, version: '9.9.9' }));
    const result = await check(dir);
    expect(result.code).toBe(1);
    expect(result.err).toContain('CHANGELOG.md has no section "## [9.9.9] - <date>"');
  });

  it('fails for a schema version the changelog does not name, until it does', async () => {
    const dir = await copy();
    await writeFile(join(dir, 'src/engine/schema/sql/0999_next.sql'), '-- a new migration\n');
    const result = await check(dir);
    expect(result.code).toBe(1);
    expect(result.err).toContain('the catalog schema is at version 999');
    const log = join(dir, 'CHANGELOG.md');
    const text = await readFile(log, 'utf8');
    await writeFile(
      log,
      text.replace('## [Unreleased]\n', '## [Unreleased]\n\nCatalog schema version 999.\n'),
    );
    expect((await check(dir)).code).toBe(0);
  });
});

describe('the release check with --pack', () => {
  it('passes on this repository as it is built: the tarball passes publint and attw', {
    timeout: 240_000,
  }, async () => {
    // The suite's setup builds dist/ when it is missing or stale (test/support/build-setup.ts).
    expect(buildState(), 'dist/ is current (npm run build)').toBe('current');
    const result = await check(repo, '--pack');
    expect(result).toMatchObject({ code: 0, err: '' });
    expect(result.out).toContain('the packed tarball passes publint and @arethetypeswrong/cli');
  });

  it('fails for a package whose exports point at a file the tarball lacks', {
    timeout: 240_000,
  }, async () => {
    const dir = await copy();
    await cp(join(repo, 'dist'), join(dir, 'dist'), { recursive: true });
    await cp(join(repo, 'README.md'), join(dir, 'README.md'));
    await symlink(join(repo, 'node_modules'), join(dir, 'node_modules'));
    const pkgPath = join(dir, 'package.json');
    const pkg = JSON.parse(await readFile(pkgPath, 'utf8')) as Record<string, unknown>;
    const exports = pkg.exports as Record<string, Record<string, string>>;
    delete pkg.workspaces;
    await writeFile(
      pkgPath,
      JSON.stringify({
        ...pkg,
        exports: { ...exports, '.': { ...exports['.'], types: './dist/engine/missing.d.ts' } },
      }),
    );
    const result = await check(dir, '--pack');
    expect(result.code).toBe(1);
    expect(result.err).toContain('release check: publint failed');
    expect(result.err).toContain('dist/engine/missing.d.ts');
  });
});
