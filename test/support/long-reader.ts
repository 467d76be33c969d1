import type postgres from 'postgres';
import { SWITCH_LOCK_TIMEOUT_MS } from '../../src/engine/staging/redefine-switch.js';
import { sqlClient } from './database.js';

/**
 * Holds a lock on `table` (a long reader), on a connection of its own, until the returned
 * function is called. `before` runs on that connection first (outside the reader's
 * transaction). `mode`: ROW SHARE (the default: a `SELECT … FOR SHARE` report), which
 * conflicts with every lock a redefinition's switch takes, so it holds any switch off; or
 * ACCESS SHARE (a plain SELECT), which conflicts only with ACCESS EXCLUSIVE: a switch taking
 * EXCLUSIVE (no column changes) goes on beside it (ADR 0055's fourth addendum).
 *
 * Returns only once the reader is long by the engine's own measure: its transaction began
 * more than the switch's lock timeout ago (server clock), so the staging worker makes no
 * attempt at a redefinition's switch it conflicts with from then on (ADR 0055). Before that,
 * the switch may be attempted and, the lock not had within its timeout, tried again (the
 * engine's design): a test that returned at once saw a switch that became possible within
 * the first 500 ms go through (issue #25's skipped test, on idle runs).
 */
export async function holdRead(
  url: string,
  table: string,
  before?: (sql: postgres.Sql) => Promise<void>,
  mode: 'ROW SHARE' | 'ACCESS SHARE' = 'ROW SHARE',
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
    await tx.unsafe(`LOCK TABLE ${table} IN ${mode} MODE`);
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
