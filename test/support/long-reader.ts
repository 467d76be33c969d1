import type postgres from 'postgres';
import { sqlClient } from './database.js';

/**
 * Holds an ACCESS SHARE lock on `table` (a long reader), on a connection of its own, until
 * the returned function is called. `before` runs on that connection first (outside the
 * reader's transaction).
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
