/**
 * Seeds and sizes of the randomized tests, so a failing run can be replayed (issue #10):
 * each randomized test prints its seed in one line (`[seed] convergence 11`), and
 * `TRELLIS_TEST_SEED=11` runs that seed alone, performing the same operations.
 * `TRELLIS_TEST_SOAK=1` (`npm run test:soak`) runs the same tests with many fresh seeds and
 * ten times the operations. See test/README.md.
 */

import { inject } from 'vitest';

/** Whether this is a soak run (`TRELLIS_TEST_SOAK=1`). */
export const SOAK = ['1', 'true', 'yes'].includes(process.env.TRELLIS_TEST_SOAK ?? '');

/** How much bigger a soak run's workloads are. */
export const SOAK_FACTOR = 10;

/**
 * How many of a randomized test's default seeds to run (`TRELLIS_TEST_SEED_COUNT`): CI's
 * matrix runs the first one on each server and capture, the full run all of them.
 */
function seedCount(): number | undefined {
  const value = process.env.TRELLIS_TEST_SEED_COUNT;
  if (value === undefined || value === '') return undefined;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 1) {
    throw new Error(`TRELLIS_TEST_SEED_COUNT must be a positive integer, not ${value}`);
  }
  return n;
}

/** The seed to replay (`TRELLIS_TEST_SEED`), if one is set. */
function replaySeed(): number | undefined {
  const value = process.env.TRELLIS_TEST_SEED;
  if (value === undefined || value === '') return undefined;
  const seed = Number(value);
  if (!Number.isSafeInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw new Error(`TRELLIS_TEST_SEED must be an integer from 0 to 2^32-1, not ${value}`);
  }
  return seed;
}

/**
 * The seeds a randomized test runs with: the replayed seed alone when
 * `TRELLIS_TEST_SEED` is set; in a soak run, `defaults` and fresh random seeds up to
 * `soakSeeds` in all; otherwise `defaults`.
 */
export function testSeeds(defaults: number[], soakSeeds = 20): number[] {
  const replay = replaySeed();
  if (replay !== undefined) return [replay];
  if (!SOAK) return defaults.slice(0, seedCount() ?? defaults.length);
  const fresh = Array.from({ length: Math.max(0, soakSeeds - defaults.length) }, () =>
    Math.floor(Math.random() * 0x100000000),
  );
  return [...defaults, ...fresh];
}

/**
 * The fast-check seed of a file's property tests: `TRELLIS_TEST_SEED` when set, otherwise
 * a fresh one each run (so runs keep exploring), printed with the command that replays it.
 * fast-check's own failure message then names this seed too.
 */
export function propertySeed(name: string, file: string): number {
  const seed = replaySeed() ?? Math.floor(Math.random() * 0x80000000);
  announceSeed(name, seed, file);
  return seed;
}

/** An operation count, times SOAK_FACTOR in a soak run. */
export function scaled(operations: number): number {
  return SOAK ? operations * SOAK_FACTOR : operations;
}

/** A test's timeout: `normalMs`, or `soakMs` in a soak run. */
export function timeoutFor(normalMs: number, soakMs = normalMs * SOAK_FACTOR): number {
  return SOAK ? soakMs : normalMs;
}

/**
 * How this run was set up, as the variables that set it up again: the capture
 * (`TRELLIS_TEST_CAPTURE`), the kind of server (`TRELLIS_TEST_PG`, with the directory of
 * the binaries first on PATH for a `path` server, so CI's run on Postgres 16 replays on 16),
 * and a soak's sizes. A server given by URL is named by `TRELLIS_TEST_DATABASE_URL`, which
 * the line does not print (it may hold a password): the description says so.
 */
export function replaySetup(): { env: string[]; description: string } {
  const pg = inject('pg');
  const capture = process.env.TRELLIS_TEST_CAPTURE === 'logical' ? 'logical' : 'trigger';
  const env = [`TRELLIS_TEST_CAPTURE=${capture}`];
  if (pg.kind === 'path' && pg.binDir) env.push(`PATH=${pg.binDir}:$PATH`);
  if (pg.kind === 'url') env.push('TRELLIS_TEST_DATABASE_URL=<the same server>');
  else env.push(`TRELLIS_TEST_PG=${pg.kind}`);
  if (SOAK) env.push('TRELLIS_TEST_SOAK=1');
  // Property tests' sizes (test/grammar.test.ts, test/statements-property.test.ts).
  const runs = process.env.TRELLIS_PROPERTY_RUNS;
  if (runs) env.push(`TRELLIS_PROPERTY_RUNS=${runs}`);
  const major = Math.floor(pg.serverVersion / 10_000);
  const minor = pg.serverVersion % 10_000;
  const description = `Postgres ${major}.${minor} (${pg.kind}), ${capture} capture`;
  return { env, description };
}

/**
 * The command that replays a run: its setup (`replaySetup`), the seed, and a case's path
 * when there is one (`TRELLIS_TEST_PATH`, fast-check's path of a differential case).
 */
export function replayCommand(file: string, seed: number, path?: string): string {
  const { env } = replaySetup();
  const vars = [...env, `TRELLIS_TEST_SEED=${seed}`];
  if (path !== undefined) vars.push(`TRELLIS_TEST_PATH=${path}`);
  return `${vars.join(' ')} npx vitest run ${file}`;
}

/**
 * Prints the one line that lets a run be replayed: `[seed] <name> <seed>`, the server
 * and capture it ran on, then the command that replays it (with the case's path when one
 * case is replayed).
 */
export function announceSeed(name: string, seed: number, file: string, path?: string): void {
  const { description } = replaySetup();
  console.log(
    `[seed] ${name} ${seed} on ${description} (replay: ${replayCommand(file, seed, path)})`,
  );
}
