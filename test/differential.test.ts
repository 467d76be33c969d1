import { differentialSuite } from './support/differential-run.js';
import { livePipeline } from './support/live.js';
import { VALUE_TYPES_SETUP } from './support/random-values.js';

// Differential testing (issue #10): random schemas, random TRANSFORMs over them, random
// concurrent writes; every target must equal its definition run by Postgres (the oracle).
// A failing case shrinks to a small one, printed as SQL with the command that replays it.
// See test/README.md.

const live = livePipeline({
  setup: (db) => db.sql.unsafe(VALUE_TYPES_SETUP).then(() => undefined),
});

differentialSuite({
  file: 'test/differential.test.ts',
  label: 'differential',
  live,
  seeds: [1, 2, 3],
});
