import type postgres from 'postgres';
import { SWITCH_LOCK_TIMEOUT_MS } from '../../src/engine/staging/redefine-switch.js';
import { sqlClient } from './database.js';

/**
 * Holds an ACCESS SHARE lock on `table` (a long reader), on a connection of its own, until
 * the returned function is called. `before` runs on that connection first (outside the
 * reader's transaction).
 *
 * Returns only once the reader is long by the engine's own measure: its transaction began
 * more than the switch's lock timeout ago (server clock), so the staging worker makes no
 * attempt at a redefinition's switch from then on (ADR 0055). Before that, a switch taking
 * EXCLUSIVE only (no column changes: the lock ACCESS SHARE readers read beside) goes ahead
 * under the reader, as it should: a test that returned at once saw a switch that became
 * possible within the first 500 ms go through (issue #25's skipped test, on idle runs).
 */
export async function holdRead(
  url: string,
  table: string,
  before?: (sql: postgres.Sql) => Promise<void>,
): Promise<() => Promise<void>> {
  const sql = sqlClient(url, { max: 1 });
  if (before) await before(sql);
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => {
    locked = resolve;
  });
  const done = sql.begin(async (tx) => {
    await tx.unsafe(`LOCK TABLE ${table} IN ACCESS SHARE MODE`);
    // Long: older than the switch's lock timeout, with a margin, by the server's clock.
    await tx.unsafe(
      `SELECT pg_sleep(greatest(0, ${(SWITCH_LOCK_TIMEOUT_MS + 100) / 1000}
                              - extract(epoch FROM clock_timestamp() - transaction_timestamp())))`,
    );
    locked();
    await released;
  });
  await isLocked;
  return async () => {
    release();
    await done;
    await sql.end({ timeout: 2 });
  };
}
