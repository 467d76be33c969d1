/**
 * Whether this run is CI's (`.ci/run` exports `CI=1`; a run it relocated sets
 * `TRELLIS_CI_RELOCATED`). CI provides every tool the suite uses (Chromium, PgBouncer, a
 * pg_dump for each server, a cluster of the suite's own): there a missing one fails the
 * test rather than skipping it, so that no part of the suite goes unrun unseen (issue #24).
 */
export const IN_CI = Boolean(process.env.CI || process.env.TRELLIS_CI_RELOCATED);

/**
 * Skips the running test with `reason` printed, or, under CI, fails it with `reason`.
 * `ctx` is the test's context (`it('…', async (ctx) => …)`).
 */
export function skipUnlessCi(ctx: { skip: (note?: string) => void }, reason: string): never {
  if (IN_CI) throw new Error(`under CI this must not be skipped: ${reason}`);
  console.log(`[skip] ${reason}`);
  ctx.skip(reason);
  throw new Error('unreachable: ctx.skip() ends the test');
}
