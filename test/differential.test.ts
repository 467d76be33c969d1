import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type CaseSizes, caseArb, runCase } from './support/differential-case.js';
import { livePipeline } from './support/live.js';
import { VALUE_TYPES_SETUP } from './support/random-values.js';
import { announceSeed, SOAK, testSeeds, timeoutFor } from './support/seeds.js';

// Differential testing (issue #10): random schemas, random TRANSFORMs over them, random
// concurrent writes; every target must equal its definition run by Postgres (the oracle).
// A failing case shrinks to a small one, printed as SQL with its seed and shrink path.
// See test/README.md.

const live = livePipeline({
  setup: (db) => db.sql.unsafe(VALUE_TYPES_SETUP).then(() => undefined),
});

const SIZES: CaseSizes = SOAK
  ? { tables: 3, rows: 10, transforms: 3, writers: 4, steps: 14 }
  : { tables: 3, rows: 8, transforms: 3, writers: 3, steps: 6 };

/** Cases per seed. */
const RUNS = SOAK ? 25 : 4;

/** How long shrinking a failure may take before the smallest case so far is reported. */
const SHRINK_MS = timeoutFor(150_000, 900_000);

let cases = 0;

describe.each(testSeeds([1, 2], 8))('random transforms through the pipeline (seed %i)', (seed) => {
  it('leaves every target equal to its definition', {
    timeout: SHRINK_MS + timeoutFor(120_000, 1_800_000),
  }, async () => {
    announceSeed('differential', seed, 'test/differential.test.ts');
    const path = process.env.TRELLIS_TEST_PATH || undefined;
    const details = await fc.check(
      fc.asyncProperty(caseArb(SIZES), async (c) => {
        cases += 1;
        await runCase(live, c, `d${cases}`, timeoutFor(30_000, 120_000));
      }),
      {
        seed,
        numRuns: RUNS,
        ...(path ? { path } : {}),
        endOnFailure: false,
        plugins: [fc.interruptAfterTimeLimit(SHRINK_MS + timeoutFor(60_000, 900_000))],
      },
    );
    if (details.failed) {
      const error = details.errorInstance as Error | undefined;
      const replay = `TRELLIS_TEST_SEED=${seed} TRELLIS_TEST_PATH=${details.counterexamplePath}`;
      console.log(
        `[differential] seed ${seed} failed after ${details.numRuns} case(s), shrunk ${details.numShrinks} time(s)` +
          ` (replay the smallest: ${SOAK ? 'TRELLIS_TEST_SOAK=1 ' : ''}${replay} npx vitest run test/differential.test.ts)\n` +
          `${error?.message ?? String(details.errorInstance)}`,
      );
    }
    expect(details.failed ? (details.errorInstance as Error).message : 'every target matched').toBe(
      'every target matched',
    );
  });
});
