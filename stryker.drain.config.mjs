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
  // Three of the SQL builders' functions: heldFor, selectList and restrictedWhere
  // (sql-parts.ts), and deltaRecomputeSql (delta-sql.ts). Widen with `--mutate` (see
  // test/README.md); each mutant reached by a test costs 20 s to a minute on two cores.
  mutate: ['src/engine/drain/sql-parts.ts:102-145', 'src/engine/drain/delta-sql.ts:576-617'],
  vitest: { configFile: 'vitest.mutations-drain.config.ts' },
  // A mutant whose SQL breaks makes the tests wait out their convergence deadlines:
  // cut after this (on top of the test's own time), counted as detected (a timeout).
  timeoutMS: 15000,
  htmlReporter: { fileName: 'reports/mutation-drain/mutation.html' },
  jsonReporter: { fileName: 'reports/mutation-drain/mutation.json' },
};
