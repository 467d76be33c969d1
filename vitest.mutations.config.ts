import { defineConfig, mergeConfig } from 'vitest/config';
import base from './vitest.config.js';

// The focused subset each mutant of the SQL builders runs (stryker.config.json): the live
// pipeline (capture, ledger, backfill, re-derivation), joins and HAVING (routing), and
// aggregates kept by delta. A few minutes a run on two cores; the full suite would make a
// mutation run take days.
export default mergeConfig(
  base,
  defineConfig({
    test: {
      include: ['test/pipeline.test.ts', 'test/routing.test.ts', 'test/delta-aggregates.test.ts'],
    },
  }),
);
