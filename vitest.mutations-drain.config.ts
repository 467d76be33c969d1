import { defineConfig } from 'vitest/config';
import base from './vitest.config.js';

// The test file of the scoped mutation run (`npm run test:mutations:drain`,
// stryker.drain.config.mjs), which mutates heldFor, selectList and restrictedWhere
// (src/engine/drain/sql-parts.ts): quarantine reaches all three (held columns, a failing
// WHERE). Add `test/delta-aggregates.test.ts` for delta-sql.ts, `test/pipeline.test.ts`
// for the upsert. Every test of the file runs for each mutant until one fails.
// No build step (the sandbox's sources are instrumented; the tests import src/).
export default defineConfig({
  ...base,
  test: {
    ...base.test,
    globalSetup: ['test/support/global-setup.ts'],
    include: ['test/quarantine.test.ts'],
  },
});
