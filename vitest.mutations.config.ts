import { defineConfig } from 'vitest/config';
import base from './vitest.config.js';

// The focused subset each mutant of the SQL builders runs (stryker.config.json): the live
// pipeline (capture, ledger, backfill, re-derivation), joins and HAVING (routing), and
// aggregates kept by delta. A few minutes a run on two cores; the full suite would make a
// mutation run take days.
// (Not mergeConfig: it would append this include to the base's, running every file.)
export default defineConfig({
  ...base,
  test: {
    ...base.test,
    include: ['test/pipeline.test.ts', 'test/routing.test.ts', 'test/delta-aggregates.test.ts'],
  },
});
