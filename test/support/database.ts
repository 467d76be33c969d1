import type postgres from 'postgres';
import { inject } from 'vitest';
import { createClient } from '../../src/engine/db/client.js';
import { dropReplicationSlots } from '../../src/testing/replication-slots.js';

const openClients = new Set<postgres.Sql>();
const cleanups: Array<() => Promise<void>> = [];

/** Drops the databases this file made (run by the leak check once the file's own hooks ran). */
export async function dropTestDatabases(): Promise<void> {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
}

export function openClientCount(): number {
  return openClients.size;
}

/** A postgres.js client for assertions; closed automatically when the file ends. */
export function sqlClient(
  url: string,
  options: postgres.Options<Record<string, postgres.PostgresType>> = {},
): postgres.Sql {
  const sql = createClient(url, { max: 4, ...options });
  openClients.add(sql);
  const end = sql.end.bind(sql);
  sql.end = async (opts) => {
    openClients.delete(sql);
    return end(opts);
  };
  return sql;
}

export interface TestDatabase {
  name: string;
  url: string;
  /** An admin client on this database. */
  sql: postgres.Sql;
}

let counter = 0;

function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

/** Admin access to the suite's server (the `postgres` database). */
export function serverInfo() {
  return inject('pg');
}

/**
 * A database of this test file's own (or test's own), cloned from the suite's template;
 * dropped, with its sessions, when the file ends.
 */
export async function freshDatabase(): Promise<TestDatabase> {
  const pg = inject('pg');
  counter += 1;
  const name = `t_${process.pid}_${Date.now().toString(36)}_${counter}`;
  const admin = sqlClient(pg.adminUrl, { max: 1 });
  await admin.unsafe(`CREATE DATABASE "${name}" TEMPLATE "${pg.template}"`);
  const url = withDatabase(pg.adminUrl, name);
  const sql = sqlClient(url);
  cleanups.push(async () => {
    await sql.end({ timeout: 2 });
    await dropReplicationSlots(admin, name);
    await admin.unsafe(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
    await admin.end({ timeout: 2 });
  });
  return { name, url, sql };
}
