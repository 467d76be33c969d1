/**
 * Seeds and sizes of the randomized tests, so a failing run can be replayed (issue #10):
 * each randomized test prints its seed in one line (`[seed] convergence 11`), and
 * `TRELLIS_TEST_SEED=11` runs that seed alone, performing the same operations.
 * `TRELLIS_TEST_SOAK=1` (`npm run test:soak`) runs the same tests with many fresh seeds and
 * ten times the operations. See test/README.md.
 */

/** Whether this is a soak run (`TRELLIS_TEST_SOAK=1`). */
export const SOAK = ['1', 'true', 'yes'].includes(process.env.TRELLIS_TEST_SOAK ?? '');

/** How much bigger a soak run's workloads are. */
export const SOAK_FACTOR = 10;

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
  if (!SOAK) return defaults;
  const fresh = Array.from({ length: Math.max(0, soakSeeds - defaults.length) }, () =>
    Math.floor(Math.random() * 0x100000000),
  );
  return [...defaults, ...fresh];
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
 * Prints the one line that lets a run be replayed: `[seed] <name> <seed>`, then the
 * command that replays it.
 */
export function announceSeed(name: string, seed: number, file: string): void {
  const env = `${SOAK ? 'TRELLIS_TEST_SOAK=1 ' : ''}TRELLIS_TEST_SEED=${seed}`;
  console.log(`[seed] ${name} ${seed} (replay: ${env} npx vitest run ${file})`);
}
