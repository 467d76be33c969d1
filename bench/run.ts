import { execFileSync } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus, loadavg, platform, release, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeAlternatives } from './charts.js';
import { findPgbench } from './load.js';
import { table } from './report.js';
import { type BenchResults, type Figure, PartialFailure } from './scenario.js';
import { SCENARIOS } from './scenarios.js';
import { benchDatabase, benchServer, dropBenchDatabase } from './support.js';

/**
 * `npm run bench`: every scenario (or those named in BENCH_ONLY=write,bulk,...) on one
 * durable throwaway cluster (or BENCH_DATABASE_URL's server), each in a database of its
 * own; prints a table and writes bench/results/latest.json. BENCH_SECONDS sets the
 * length of each throughput measurement.
 */
const only = (process.env.BENCH_ONLY ?? '')
  .split(',')
  .map((s) => s.trim())
  .filter(Boolean);
const unknown = only.filter((name) => !SCENARIOS.some((s) => s.name === name));
if (unknown.length) {
  console.error(
    `BENCH_ONLY: no scenario ${unknown.join(', ')} (there are: ${SCENARIOS.map((s) => s.name).join(', ')})`,
  );
  process.exit(2);
}
const seconds = Number(process.env.BENCH_SECONDS ?? 6);
if (!(seconds > 0)) {
  console.error('BENCH_SECONDS must be a positive number of seconds');
  process.exit(2);
}
const chosen = only.length ? SCENARIOS.filter((s) => only.includes(s.name)) : SCENARIOS;
const log = (message: string) => console.error(`  ${message}`);

const startedAt = new Date();
const loadAtStart = loadavg();
if (loadAtStart[0]! > cpus().length / 2) {
  console.error(
    `warning: load average ${loadAtStart[0]!.toFixed(1)} on ${cpus().length} cores: other work on this machine will skew the figures`,
  );
}
// The 1-minute load average every 15 s: what else the machine ran shows in the results.
const loadDuring: number[] = [];
const loadSampler = setInterval(() => loadDuring.push(loadavg()[0]!), 15_000);
loadSampler.unref();
const server = await benchServer(Object.assign({}, ...chosen.map((s) => s.server ?? {})));
const figures: Figure[] = [];
const failures: Array<{ scenario: string; error: string }> = [];
let settings: Record<string, string> = {};
try {
  const rows = await server.adminQuery<{ name: string; setting: string }>(
    `SELECT name, setting || coalesce(unit, '') AS setting FROM pg_settings
      WHERE name IN ('server_version', 'fsync', 'full_page_writes', 'synchronous_commit',
                     'wal_sync_method', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout',
                     'wal_level')`,
  );
  settings = Object.fromEntries(rows.map((r) => [r.name, r.setting]));
  console.error(
    `Postgres ${settings.server_version} (fsync ${settings.fsync}, full_page_writes ${settings.full_page_writes}, wal_level ${settings.wal_level}), ${cpus().length} cores, load by ${findPgbench() ? 'pgbench' : 'postgres.js clients'}`,
  );
  for (const scenario of chosen) {
    console.error(`${scenario.title}`);
    const db = await benchDatabase(server);
    const started = performance.now();
    try {
      figures.push(...(await scenario.run({ db, seconds, log })));
    } catch (error) {
      if (error instanceof PartialFailure) figures.push(...error.figures);
      const message = error instanceof Error ? (error.stack ?? error.message) : String(error);
      failures.push({ scenario: scenario.name, error: message });
      console.error(`  FAILED: ${message}`);
    } finally {
      await dropBenchDatabase(db);
    }
    log(`(${((performance.now() - started) / 1000).toFixed(0)} s)`);
  }
} finally {
  clearInterval(loadSampler);
  await server.stop();
}

console.log(`\n${table(figures)}`);
for (const f of failures) console.log(`\n${f.scenario}: FAILED (${f.error.split('\n')[0]})`);

const finishedAt = new Date();
let commit: string | null = null;
let engineChanged: boolean | null = null;
try {
  commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  // Figures from uncommitted engine code are not the commit's figures.
  engineChanged =
    execFileSync('git', ['status', '--porcelain', '--', 'src'], { encoding: 'utf8' }).trim() !== '';
} catch {
  // not a git checkout
}
const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'latest.json');
const results: BenchResults = {
  startedAt,
  finishedAt,
  seconds: (finishedAt.getTime() - startedAt.getTime()) / 1000,
  commit,
  engineChanged,
  machine: {
    cores: cpus().length,
    cpu: cpus()[0]?.model ?? null,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    os: `${platform()} ${release()}`,
    node: process.version,
    loadAverage: { start: loadAtStart, end: loadavg(), during: loadDuring },
  },
  server: { kind: server.kind, settings },
  options: { only: only.length ? only : null, secondsPerMeasurement: seconds },
  figures,
  failures,
};
await mkdir(dirname(out), { recursive: true });
await writeFile(out, `${JSON.stringify(results, null, 2)}\n`);
console.log(`\n(${out}, ${((finishedAt.getTime() - startedAt.getTime()) / 1000).toFixed(0)} s)`);
// The side-by-side scenario's charts and figures, for README (docs/performance/).
if (figures.some((f) => f.scenario === 'alternatives')) {
  for (const file of await writeAlternatives(results)) console.log(file);
}
if (failures.length) process.exitCode = 1;
