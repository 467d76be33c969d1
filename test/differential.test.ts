import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type CaseSizes, caseArb, caseSummary, runCase } from './support/differential-case.js';
import { livePipeline } from './support/live.js';
import { VALUE_TYPES_SETUP } from './support/random-values.js';
import { announceSeed, SOAK, testSeeds, timeoutFor } from './support/seeds.js';

// Differential testing (issue #10): random schemas, random TRANSFORMs over them, random
// concurrent writes; every target must equal its definition run by Postgres (the oracle).
// A failing case shrinks to a small one, printed as SQL with the command that replays it.
// See test/README.md.

const live = livePipeline({
  setup: (db) => db.sql.unsafe(VALUE_TYPES_SETUP).then(() => undefined),
});

const SIZES: CaseSizes = SOAK
  ? { tables: 3, rows: 10, transforms: 3, writers: 4, steps: 14 }
  : { tables: 3, rows: 8, transforms: 3, writers: 3, steps: 8 };

/** Cases per seed. */
const RUNS = SOAK ? 25 : 5;

/** How long a case may take to converge before it counts as a failure. */
const CONVERGE_MS = timeoutFor(30_000, 120_000);

/**
 * How long shrinking a failure may go on (counted from the first failure); then the
 * smallest failing case so far is reported.
 */
const SHRINK_MS = timeoutFor(90_000, 900_000);

/** A path fast-check printed (`TRELLIS_TEST_PATH`): replays that one case, unshrunk. */
const REPLAY_PATH = process.env.TRELLIS_TEST_PATH || undefined;

const FILE = 'test/differential.test.ts';

let prefixes = 0;

describe.each(testSeeds([1, 2, 3], 8))(
  'random transforms through the pipeline (seed %i)',
  (seed) => {
    it('leaves every target equal to its definition', {
      timeout: RUNS * CONVERGE_MS + SHRINK_MS + 60_000,
    }, async () => {
      announceSeed('differential', seed, FILE);
      const replayEnv = `${SOAK ? 'TRELLIS_TEST_SOAK=1 ' : ''}TRELLIS_TEST_SEED=${seed}`;
      let ran = 0;
      let firstFailureAt: number | undefined;
      let shrinks = 0;
      const property = fc.asyncProperty(caseArb(SIZES), async (c) => {
        // Once shrinking has had its time, every further candidate passes at once, so
        // fast-check ends with the smallest failing case found (a case cannot be
        // interrupted half-way: its tables and transforms must be dropped).
        if (firstFailureAt !== undefined && Date.now() - firstFailureAt > SHRINK_MS) return;
        const shrinking = firstFailureAt !== undefined;
        if (shrinking) shrinks += 1;
        else ran += 1;
        prefixes += 1;
        const started = Date.now();
        try {
          const outcome = await runCase(live, c, `d${prefixes}`, CONVERGE_MS);
          if (shrinking) {
            console.log(
              `[differential] seed ${seed} shrink ${shrinks}: passes (${caseSummary(c)})`,
            );
          } else {
            const w = outcome.writes;
            console.log(
              `[differential] seed ${seed} case ${ran} ok in ${Date.now() - started} ms: ${caseSummary(c)}; ` +
                `writes: ${w.committed} committed, ${w.rolledBack} rolled back, ${w.savepointsRolledBack} savepoints rolled back, ` +
                `${w.truncates} truncates, ${w.longTransactions} held open, expected errors ${JSON.stringify(w.expected)}`,
            );
          }
        } catch (error) {
          if (!shrinking) {
            firstFailureAt = Date.now();
            console.log(
              `[differential] seed ${seed} case ${ran} failed; shrinking it for up to ${SHRINK_MS / 1000} s. ` +
                `The failure as found:\n${(error as Error).message}`,
            );
          } else {
            console.log(`[differential] seed ${seed} shrink ${shrinks}: fails (${caseSummary(c)})`);
          }
          throw error;
        }
      });
      const details = await fc.check(property, {
        seed,
        numRuns: RUNS,
        ...(REPLAY_PATH ? { path: REPLAY_PATH, endOnFailure: true } : {}),
      });
      if (details.failed) {
        const error = details.errorInstance as Error | undefined;
        console.log(
          `[differential] seed ${seed}: the smallest failing case (after ${details.numShrinks} shrinks). ` +
            `Replay it: ${replayEnv} TRELLIS_TEST_PATH=${details.counterexamplePath} npx vitest run ${FILE}\n` +
            `${error?.message ?? String(details.errorInstance)}`,
        );
      }
      expect(
        details.failed ? (details.errorInstance as Error).message : 'every target matched',
      ).toBe('every target matched');
      // Not a vacuous pass: every case ran through the pipeline.
      expect(ran).toBe(REPLAY_PATH ? 1 : RUNS);
    });
  },
);
