import { dirname } from 'node:path';
import type { TestProject } from 'vitest/node';
import { binariesOnPath } from '../../src/testing/cluster.js';
import { startPostgres, type TestPostgres } from '../../src/testing/index.js';

declare module 'vitest' {
  export interface ProvidedContext {
    pg: {
      adminUrl: string;
      kind: string;
      serverVersion: number;
      template: string;
      /** Where the server binaries of a `path` server were found (for the replay lines). */
      binDir: string | undefined;
    };
  }
}

export const TEMPLATE = 'trellis_test_template';

let server: TestPostgres | undefined;

export async function setup(project: TestProject): Promise<void> {
  // PREPARE TRANSACTION is off by default (max_prepared_transactions = 0); some tests hold
  // locks with prepared transactions. A server from TRELLIS_TEST_DATABASE_URL keeps its own
  // setting, and those tests skip when it is 0.
  // wal_level = logical for WAL capture (ADR 0023): its tests run in every run, and
  // TRELLIS_TEST_CAPTURE=logical runs the whole suite with it; a database in that mode
  // holds a replication slot and a WAL sender while its file runs.
  server = await startPostgres({
    settings: {
      max_prepared_transactions: 10,
      wal_level: 'logical',
      max_replication_slots: 40,
      max_wal_senders: 40,
    },
  });
  await server.dropDatabase(TEMPLATE);
  await server.createDatabase({ name: TEMPLATE, template: 'template0' });
  // Roles some tests log in as; cluster-wide, so created once here.
  await server.adminQuery(`
    DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trellis_password_auth') THEN
        CREATE ROLE trellis_password_auth NOLOGIN;
      END IF;
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'trellis_tls_only') THEN
        CREATE ROLE trellis_tls_only NOLOGIN;
      END IF;
    END $$`);
  console.log(
    `[test] Postgres ${server.serverVersion} (${server.kind}) at ${new URL(server.adminUrl).host}`,
  );
  project.provide('pg', {
    adminUrl: server.adminUrl,
    kind: server.kind,
    serverVersion: server.serverVersion,
    template: TEMPLATE,
    // The same lookup startPostgres made: a replay line puts this directory first on PATH,
    // so a run on another major's binaries (CI's matrix) replays on that major.
    binDir: server.kind === 'path' ? dirname(binariesOnPath()?.postgres ?? '.') : undefined,
  });
}

export async function teardown(): Promise<void> {
  await server?.stop();
}
