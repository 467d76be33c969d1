import { afterAll, beforeAll } from 'vitest';
import type { Trellis } from '../../src/engine/index.js';
import type { ConnectOptions } from '../../src/engine/options.js';
import { freshDatabase, type TestDatabase } from './database.js';
import {
  type Definition,
  expectMatchesDefinition,
  type OracleOptions,
  transformStatement,
} from './oracle.js';
import { migratedTrellis, waitForStatus } from './trellis.js';

export interface LivePipeline {
  readonly db: TestDatabase;
  /** A handle running the staging worker and drain loops. */
  readonly trellis: Trellis;
  /** Defines each transform and waits until it is live. */
  define(...defs: Definition[]): Promise<void>;
  /**
   * Waits until every write committed so far has reached each target, then compares each
   * with its definition as the test wrote it (the oracle).
   */
  converged(defs: Definition | Definition[], oracle?: OracleOptions): Promise<void>;
  /** Runs each write, then waits for it and compares every definition (`converged`). */
  steps(defs: Definition[], writes: string[]): Promise<void>;
}

/**
 * A test file's live pipeline: a database of its own, migrated, and a handle with the
 * staging worker and `drainThreads` drain loops (2 unless given), shut down after the file.
 * `setup` runs on the database before the handle connects.
 */
export function livePipeline(
  options: Partial<ConnectOptions> & { setup?: (db: TestDatabase) => Promise<void> } = {},
): LivePipeline {
  const { setup, ...connect } = options;
  let db: TestDatabase | undefined;
  let trellis: Trellis | undefined;
  beforeAll(async () => {
    db = await freshDatabase();
    await setup?.(db);
    trellis = await migratedTrellis(db, { staging: true, drainThreads: 2, ...connect });
  });
  afterAll(async () => {
    await trellis?.shutdown();
  });
  const live: LivePipeline = {
    get db() {
      if (!db) throw new Error('the live pipeline is set up in beforeAll');
      return db;
    },
    get trellis() {
      if (!trellis) throw new Error('the live pipeline is set up in beforeAll');
      return trellis;
    },
    async define(...defs) {
      for (const d of defs) {
        await live.trellis.apply(transformStatement(d));
        await waitForStatus(live.trellis, d.target, 'live');
      }
    },
    async converged(defs, oracle = {}) {
      const token = await live.trellis.watermarkToken();
      for (const d of Array.isArray(defs) ? defs : [defs]) {
        await live.trellis.awaitConverged(d.target, token, { timeoutMs: 25_000 });
        await expectMatchesDefinition(live.db.sql, d, oracle);
      }
    },
    async steps(defs, writes) {
      for (const write of writes) {
        await live.db.sql.unsafe(write);
        await live.converged(defs);
      }
    },
  };
  return live;
}
