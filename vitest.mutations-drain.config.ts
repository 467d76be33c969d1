import { defineConfig } from 'vitest/config';
import base from './vitest.config.js';

// The focused subset of the scoped mutation run (`npm run test:mutations:drain`,
// stryker.drain.config.mjs): the two files it mutates, `drain/sql-parts.ts` (the upsert,
// key match, select list and restricted WHERE every re-derivation is built from) and
// `drain/delta-sql.ts` (aggregates kept by delta), are reached by the live pipeline, its
// held keys and the delta-kept aggregates. Each mutant runs only the tests that reach it
// (Stryker's per-test coverage): seconds a mutant, about an hour for the run on two cores.
// No build step (the sandbox's sources are instrumented; these tests import src/).
export default defineConfig({
  ...base,
  test: {
    ...base.test,
    globalSetup: ['test/support/global-setup.ts'],
    include: ['test/quarantine.test.ts'],
  },
});
