#!/usr/bin/env node
// Rewrites the Trellis schema migrations of the shop example (examples/shop/drizzle) with
// the SQL this build writes for the versions each one names: the install at its version,
// and each upgrade from the version before it to its own, carrying only the migrations in
// between (ADR 0042). The journal and snapshots are left as they are: the files keep their
// names and order. A new upgrade is added the way an app adds one, after `npm run build`:
//   cd examples/shop && npx trellis generate upgrade
// Usage: node scripts/regenerate-shop-migrations.mjs [--check]
//   --check  rewrites nothing; exits 1 naming each file that differs from what it would write.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const repo = resolve(import.meta.dirname, '..');
const folder = join(repo, 'examples/shop/drizzle');
const check = process.argv.includes('--check');

let installSql;
let upgradeSql;
let migrations;
try {
  ({ installSql, upgradeSql } = await import(join(repo, 'dist/engine/schema/install-sql.js')));
  ({ migrations } = await import(join(repo, 'dist/engine/schema/migrations.generated.js')));
} catch (error) {
  console.error(`build trellis-pg first (npm run build): ${error.message}`);
  process.exit(2);
}
if (typeof upgradeSql !== 'function') {
  console.error('this build has no upgradeSql: npm run build');
  process.exit(2);
}

const HEADER =
  /^-- trellis-pg: (install or upgrade|upgrade) the Trellis catalog schema "(.+?)" (?:from version \d+ )?to version (\d+)\.$/m;
const WRITTEN_BY = /^-- Written by `trellis generate (install|upgrade)` \(trellis-pg [^)]+\)\.\n/;

const files = readdirSync(folder)
  .filter((f) => f.endsWith('.sql'))
  .sort();
let previous;
const stale = [];
for (const file of files) {
  const path = join(folder, file);
  const text = readFileSync(path, 'utf8');
  const header = HEADER.exec(text);
  const writtenBy = WRITTEN_BY.exec(text);
  if (!header || !writtenBy) continue;
  const schema = header[2];
  const version = Number(header[3]);
  const upTo = migrations.filter((m) => m.version <= version);
  const options = { schema, targetSchema: 'public', migrations: upTo };
  const sql =
    previous === undefined ? installSql(options) : upgradeSql({ ...options, from: previous });
  const wanted = writtenBy[0] + sql;
  previous = version;
  if (wanted === text) continue;
  stale.push(file);
  if (!check) {
    writeFileSync(path, wanted);
    console.log(`rewrote ${file} (${Buffer.byteLength(wanted)} bytes)`);
  }
}
if (check && stale.length > 0) {
  console.error(`stale: ${stale.join(', ')}: node scripts/regenerate-shop-migrations.mjs`);
  process.exit(1);
}
if (!check && stale.length === 0) console.log('the shop migrations are up to date');
