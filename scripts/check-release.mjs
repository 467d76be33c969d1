#!/usr/bin/env node
// The release check (a CI step, `npm run check:release`): package.json's version is a
// semantic version with a section of its own in CHANGELOG.md (the newest released one), and
// the catalog schema version this package installs (its newest migration) is named in
// CHANGELOG.md ("schema version N") in that section or under [Unreleased]: a schema change
// never ships without the changelog saying so, and what upgrading needs.
// With --pack (after `npm run build`), the package as it is published too: `npm pack`, then
// publint (what package.json's exports, files and types point at is in the tarball, in the
// format it says) and @arethetypeswrong/cli (each entry point's types resolve as its code
// does, for Node 16+ resolution and bundlers; CommonJS consumers load this ESM package with
// require(esm) on Node 20.19+, which attw's node16 CommonJS mode still calls dynamic import
// only: that rule is left out).
// Usage: node scripts/check-release.mjs [--root <dir>] [--pack]   (exits 1 listing each problem)
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const rootFlag = process.argv.indexOf('--root');
const root = resolve(rootFlag >= 0 ? process.argv[rootFlag + 1] : join(import.meta.dirname, '..'));
const problems = [];

const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const SEMVER =
  /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$/;
if (!SEMVER.test(version))
  problems.push(`package.json's version "${version}" is not a semantic version`);

let changelog = '';
try {
  changelog = readFileSync(join(root, 'CHANGELOG.md'), 'utf8');
} catch {
  problems.push('there is no CHANGELOG.md');
}

// Sections: "## [Unreleased]" and "## [x.y.z] - YYYY-MM-DD", in the file's order.
const sections = [];
for (const match of changelog.matchAll(/^## \[([^\]]+)\](.*)$/gm)) {
  sections.push({ name: match[1], rest: match[2], start: match.index });
}
const bodyOf = (i) =>
  changelog.slice(sections[i].start, sections[i + 1]?.start ?? changelog.length);
const released = sections.filter((s) => s.name !== 'Unreleased');
const index = sections.findIndex((s) => s.name === version);
if (changelog && index < 0) {
  problems.push(
    `CHANGELOG.md has no section "## [${version}] - <date>" for package.json's version`,
  );
} else if (changelog) {
  if (released[0]?.name !== version) {
    problems.push(
      `CHANGELOG.md's newest release is ${released[0]?.name}, not package.json's ${version}`,
    );
  }
  if (!/^ - \d{4}-\d{2}-\d{2}\s*$/.test(sections[index].rest)) {
    problems.push(
      `CHANGELOG.md's section for ${version} has no date ("## [${version}] - YYYY-MM-DD")`,
    );
  }
  if (!/^### Upgrade notes$/m.test(bodyOf(index)) && !/^### Upgrade notes$/m.test(bodyOf(0))) {
    problems.push(`CHANGELOG.md's section for ${version} has no "### Upgrade notes"`);
  }
}

// The schema version: the newest numbered migration (placeholders count: they hold a number).
const migrations = readdirSync(join(root, 'src/engine/schema/sql'))
  .map((f) => /^(\d{4})_.+\.sql$/.exec(f))
  .filter(Boolean)
  .map((m) => Number(m[1]));
const schema = Math.max(0, ...migrations);
if (changelog && index >= 0) {
  const unreleased = sections.findIndex((s) => s.name === 'Unreleased');
  const mentions = (i) => i >= 0 && new RegExp(`schema version ${schema}\\b`).test(bodyOf(i));
  if (!mentions(index) && !mentions(unreleased)) {
    problems.push(
      `the catalog schema is at version ${schema}, which CHANGELOG.md does not name ("schema version ${schema}") under ${version} or [Unreleased]: say what changed and what upgrading needs`,
    );
  }
}

if (process.argv.includes('--pack') && problems.length === 0) {
  const dir = mkdtempSync(join(tmpdir(), 'trellis-pack-'));
  const bin = (name) => join(root, 'node_modules/.bin', name);
  const run = (what, file, args) => {
    try {
      const out = execFileSync(file, args, { cwd: root, encoding: 'utf8', stdio: 'pipe' });
      return { ok: true, out };
    } catch (error) {
      problems.push(`${what} failed:\n${error.stdout ?? ''}${error.stderr ?? error.message}`);
      return { ok: false, out: '' };
    }
  };
  try {
    const packed = run('npm pack', 'npm', ['pack', '--silent', '--pack-destination', dir]);
    const tarball = join(dir, packed.out.trim().split('\n').pop() ?? '');
    if (packed.ok) {
      run('publint', bin('publint'), ['--strict', tarball]);
      run('@arethetypeswrong/cli', bin('attw'), [
        tarball,
        '--profile',
        'node16',
        '--ignore-rules',
        'cjs-resolves-to-esm',
        '--format',
        'ascii',
      ]);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (problems.length > 0) {
  for (const p of problems) console.error(`release check: ${p}`);
  process.exit(1);
}
console.log(
  `release check: trellis-pg ${version}, catalog schema version ${schema}: CHANGELOG.md is up to date${process.argv.includes('--pack') ? '; the packed tarball passes publint and @arethetypeswrong/cli' : ''}`,
);
