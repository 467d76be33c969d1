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
  mutate: ['src/engine/drain/sql-parts.ts', 'src/engine/drain/delta-sql.ts:576-617'],
  vitest: { configFile: 'vitest.mutations-drain.config.ts' },
  timeoutMS: 60000,
  htmlReporter: { fileName: 'reports/mutation-drain/mutation.html' },
  jsonReporter: { fileName: 'reports/mutation-drain/mutation.json' },
};
