import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  type Case,
  type CaseSizes,
  caseArb,
  caseSummary,
  caseText,
  runCase,
} from './differential-case.js';
import type { LivePipeline } from './live.js';
import { announceSeed, replayCommand, SOAK, testSeeds, timeoutFor } from './seeds.js';

// The differential tester's run (issue #10; test/README.md): cases fast-check generates
// from a seed, each run through a live pipeline and compared with its definition, a
// failure shrunk and printed with the command that replays it. Test files call
// differentialSuite with their pipeline (test/differential.test.ts, and the same cases
// under other plans in test/differential-scans.test.ts).

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

let prefixes = 0;

interface SuiteOptions {
  /** The test file, for the replay command it prints. */
  file: string;
  /** Names the runs in their output lines. */
  label: string;
  live: LivePipeline;
  /** Seeds `npm test` runs (TRELLIS_TEST_SEED replays one). */
  seeds: number[];
}

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

  constructor(
    private readonly seed: number,
    private readonly options: SuiteOptions,
  ) {}

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
    const tag = `[${this.options.label}] seed ${this.seed}`;
    prefixes += 1;
    const started = Date.now();
    try {
      const { writes: w } = await runCase(this.options.live, c, `d${prefixes}`, CONVERGE_MS);
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

/** The differential test: one test per seed, each running RUNS cases. */
export function differentialSuite(options: SuiteOptions): void {
  describe.each(testSeeds(options.seeds, 10))(
    'random transforms through the pipeline (seed %i)',
    (seed) => {
      it('leaves every target equal to its definition', {
        timeout: RUNS * CONVERGE_MS + SHRINK_MS + 60_000,
      }, async () => {
        announceSeed(options.label, seed, options.file, REPLAY_PATH);
        const runner = new Runner(seed, options);
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
          const replay = replayCommand(options.file, seed, details.counterexamplePath ?? undefined);
          console.log(
            `[${options.label}] seed ${seed}: the smallest failing case, after ${runner.shrinks} shrinking runs ` +
              `(and ${runner.repeats} candidates already run). Replay it: ${replay}\n` +
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
}
