import { alternatives } from './alternatives.js';
import { backfill } from './backfill.js';
import { build } from './build.js';
import { bulkInsert } from './bulk-insert.js';
import { burst } from './burst.js';
import { drain } from './drain-throughput.js';
import { freshness } from './freshness.js';
import { groupBy } from './group-by.js';
import { groupSize } from './group-size.js';
import { idle } from './idle.js';
import { joinOrder } from './join-order.js';
import { q11 } from './q11.js';
import { redefine } from './redefine.js';
import { scaleOut } from './scale-out.js';
import type { Scenario } from './scenario.js';
import { scrape } from './scrape.js';
import { selfCheck } from './self-check.js';
import { writeThroughput } from './write-throughput.js';

/** Every scenario `npm run bench` runs, in order. A new scenario: a file, and a line here. */
export const SCENARIOS: Scenario[] = [
  writeThroughput,
  bulkInsert,
  freshness,
  idle,
  drain,
  backfill,
  groupBy,
  groupSize,
  burst,
  q11,
  joinOrder,
  build,
  redefine,
  scaleOut,
  selfCheck,
  scrape,
  alternatives,
];
