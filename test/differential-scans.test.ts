import { differentialSuite } from './support/differential-run.js';
import { livePipeline } from './support/live.js';
import { VALUE_TYPES_SETUP } from './support/random-values.js';

// The differential test's cases under other plans: index scans off for the database, so
// every statement the engine runs (re-derivations, builds, key-map upkeep) reads whole
// tables (sequential scans under hash and merge joins). A target must not depend on the plan Postgres picks:
// a WHERE evaluated on rows outside the keys being re-derived once held every changed key
// (ADR 0010, "A bad row holds only itself, whatever the plan").

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      ALTER DATABASE ${db.name} SET enable_indexscan = off;
      ALTER DATABASE ${db.name} SET enable_bitmapscan = off;`);
    await db.sql.unsafe(VALUE_TYPES_SETUP);
  },
});

differentialSuite({
  file: 'test/differential-scans.test.ts',
  label: 'differential-scans',
  live,
  seeds: [4],
});
