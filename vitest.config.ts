import { defineConfig } from 'vitest/config';

// Two cores: two test files at a time. Each file gets its own database, cloned from a
// template the global setup builds once on the suite's throwaway cluster.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/build-setup.ts', 'test/support/global-setup.ts'],
    setupFiles: ['test/support/leak-check.ts'],
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    teardownTimeout: 30_000,
  },
});
