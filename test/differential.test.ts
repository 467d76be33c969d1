import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  type Case,
  type CaseSizes,
  caseArb,
  caseSummary,
  caseText,
  runCase,
} from './support/differential-case.js';
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
  ? { tables: 3, rows: 12, transforms: 3, writers: 4, steps: 24 }
  : { tables: 3, rows: 8, transforms: 3, writers: 3, steps: 12 };

/** Cases per seed. */
const RUNS = SOAK ? 40 : 7;

/** How long a case may take to converge (and its writers to finish) before it fails. */
const CONVERGE_MS = timeoutFor(30_000, 120_000);

/**
 * How long shrinking a failure may go on (counted from the first failure); then the
 * smallest failing case so far is reported.
 */
const SHRINK_MS = timeoutFor(120_000, 900_000);

/** A path fast-check printed (`TRELLIS_TEST_PATH`): replays that one case, unshrunk. */
const REPLAY_PATH = process.env.TRELLIS_TEST_PATH || undefined;

const FILE = 'test/differential.test.ts';

let prefixes = 0;

/**
 * Runs the cases fast-check generates for one seed, and tells how it goes: a line per
 * case, the failure as soon as it is found, then each shrinking step. While shrinking, a
 * candidate whose SQL is one already run (a pick shrunk to another that reads the same)
 * gets that run's outcome at once.
 */
class Runner {
  cases = 0;
  shrinks = 0;
  repeats = 0;
  private firstFailureAt: number | undefined;
  private readonly outcomes = new Map<string, Error | null>();

  constructor(private readonly seed: number) {}

  async run(c: Case): Promise<void> {
    // Once shrinking has had its time, every further candidate passes at once, so
    // fast-check ends with the smallest failing case found (a case cannot be interrupted
    // half-way: its tables and transforms must be dropped).
    if (this.firstFailureAt !== undefined && Date.now() - this.firstFailureAt > SHRINK_MS) return;
    const text = caseText(c, 'd');
    const shrinking = this.firstFailureAt !== undefined;
    if (shrinking) {
      const known = this.outcomes.get(text);
      if (known !== undefined) {
        this.repeats += 1;
        if (known) throw known;
        return;
      }
      this.shrinks += 1;
    } else {
      this.cases += 1;
    }
    const tag = `[differential] seed ${this.seed}`;
    prefixes += 1;
    const started = Date.now();
    try {
      const { writes: w } = await runCase(live, c, `d${prefixes}`, CONVERGE_MS);
      this.outcomes.set(text, null);
      console.log(
        shrinking
          ? `${tag} shrink ${this.shrinks}: passes (${caseSummary(c)})`
          : `${tag} case ${this.cases} ok in ${Date.now() - started} ms: ${caseSummary(c)}; ` +
              `writes: ${w.committed} committed, ${w.rolledBack} rolled back, ${w.savepointsRolledBack} savepoints rolled back, ` +
              `${w.truncates} truncates, ${w.longTransactions} held open, expected errors ${JSON.stringify(w.expected)}`,
      );
    } catch (error) {
      this.outcomes.set(text, error as Error);
      if (shrinking) {
        console.log(`${tag} shrink ${this.shrinks}: fails (${caseSummary(c)})`);
      } else {
        this.firstFailureAt = Date.now();
        console.log(
          `${tag} case ${this.cases} failed${REPLAY_PATH ? ' (replayed: not shrunk again)' : `; shrinking it for up to ${SHRINK_MS / 1000} s`}. ` +
            `The failure as found:\n${(error as Error).message}`,
        );
      }
      throw error;
    }
  }
}

describe.each(testSeeds([1, 2, 3], 10))(
  'random transforms through the pipeline (seed %i)',
  (seed) => {
    it('leaves every target equal to its definition', {
      timeout: RUNS * CONVERGE_MS + SHRINK_MS + 60_000,
    }, async () => {
      announceSeed('differential', seed, FILE);
      const runner = new Runner(seed);
      const details = await fc.check(
        fc.asyncProperty(caseArb(SIZES), (c) => runner.run(c)),
        {
          seed,
          // A replayed path starts at that case: run it alone (fast-check would go on with
          // the cases after it), and do not shrink it again.
          ...(REPLAY_PATH
            ? { path: REPLAY_PATH, numRuns: 1, endOnFailure: true }
            : { numRuns: RUNS }),
        },
      );
      if (details.failed) {
        const replay = `${SOAK ? 'TRELLIS_TEST_SOAK=1 ' : ''}TRELLIS_TEST_SEED=${seed} TRELLIS_TEST_PATH=${details.counterexamplePath}`;
        console.log(
          `[differential] seed ${seed}: the smallest failing case, after ${runner.shrinks} shrinking runs ` +
            `(and ${runner.repeats} candidates already run). Replay it: ${replay} npx vitest run ${FILE}\n` +
            `${(details.errorInstance as Error).message}`,
        );
      }
      expect(
        details.failed ? (details.errorInstance as Error).message : 'every target matched',
      ).toBe('every target matched');
      // Not a vacuous pass: every case ran through the pipeline.
      expect(runner.cases).toBe(REPLAY_PATH ? 1 : RUNS);
    });
  },
);
