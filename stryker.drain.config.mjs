// @ts-check
// A scoped mutation run that fits a working session on two cores (about an hour):
// `npm run test:mutations:drain`. The full run (stryker.config.json, `npm run
// test:mutations`) mutates every SQL builder against a larger subset and takes many hours.
// See test/README.md, "Mutation testing".
import { readFileSync } from 'node:fs';

const base = JSON.parse(readFileSync(new URL('./stryker.config.json', import.meta.url), 'utf8'));
delete base.$schema;
delete base._comment;

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  ...base,
  // heldFor, selectList and restrictedWhere (sql-parts.ts): every re-derivation, build and
  // held key's SQL goes through them. Widen with `--mutate` (test/README.md).
  mutate: ['src/engine/drain/sql-parts.ts:102-145'],
  // Every test of the subset for every mutant: per-test coverage misleads here. The
  // engine's workers build their SQL in the background, in hooks and under whichever test
  // is running, so a mutant was charged to tests that never look at what it breaks (a
  // mutant breaking every build "survived"; it fails the file when run by hand).
  coverageAnalysis: 'all',
  ignoreStatic: false,
  vitest: { configFile: 'vitest.mutations-drain.config.ts' },
  // A mutant whose SQL breaks makes the tests wait out their convergence deadlines:
  // cut after this (on top of the test's own time), counted as detected (a timeout).
  timeoutMS: 15000,
  htmlReporter: { fileName: 'reports/mutation-drain/mutation.html' },
  jsonReporter: { fileName: 'reports/mutation-drain/mutation.json' },
};
