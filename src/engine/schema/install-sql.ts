import { quoteIdent, quoteLiteral } from '../identifiers.js';
import { LOCK_CLASS } from '../internal/advisory-locks.js';
import { bossInstallStatements } from '../jobs/boss-install-sql.js';
import { jobsSchemaFor } from '../jobs/jobs-schema.js';
import type { Migration } from './migration.js';
import { migrations as allMigrations } from './migrations.generated.js';

/**
 * The advisory lock every installer of one catalog schema takes (migrate(), the printed
 * install SQL, a drizzle-kit migration): two racing on a fresh database serialise, and the
 * second finds everything done. The first key is "trel" in ASCII.
 */
export const MIGRATE_LOCK_CLASS = LOCK_CLASS.migrate;

export interface InstallSqlOptions {
  schema: string;
  /** The target schema recorded for the instance the first time it is installed. */
  targetSchema: string;
  migrations?: readonly Migration[];
}

export function latestVersion(migrations: readonly Migration[] = allMigrations): number {
  return migrations.reduce((max, m) => Math.max(max, m.version), 0);
}

/** Substitutes the catalog schema into a migration's SQL. */
export function renderMigration(migration: Migration, schema: string): string {
  return migration.sql
    .replaceAll('@schema@', quoteIdent(schema))
    .replaceAll('@schema_literal@', quoteLiteral(schema));
}

function dollarQuote(body: string, tag: string): string {
  if (body.includes(`$${tag}$`)) throw new Error(`migration text contains $${tag}$`);
  return `$${tag}$${body}$${tag}$`;
}

/**
 * Install-or-upgrade SQL for one catalog schema, as a single DO block: idempotent (each
 * migration runs only when its version row is missing), serialised by an advisory lock,
 * refusing a schema that holds a breaking migration newer than this code knows, and
 * atomic whether it runs in autocommit or inside someone else's migration transaction.
 * `migrate()` runs exactly this text, so mixing it with printed SQL is safe.
 */
export function installSql(options: InstallSqlOptions): string {
  const migrations = options.migrations ?? allMigrations;
  const s = quoteIdent(options.schema);
  const latest = latestVersion(migrations);
  const steps = migrations
    .map((m) => {
      const body = dollarQuote(renderMigration(m, options.schema), `trellis_m${m.version}`);
      return `
  IF NOT EXISTS (SELECT 1 FROM ${s}.migrations WHERE version = ${m.version}) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO ${s}.migrations (version, name, breaking)
      VALUES (${m.version}, ${quoteLiteral(m.name)}, ${m.breaking});
    EXECUTE ${body};
  END IF;`;
    })
    .join('\n');
  return `-- trellis-pg: install or upgrade the Trellis catalog schema ${s} to version ${latest}.
-- Safe to run again, and safe beside Trellis.migrate(): it is version-guarded and locked.
DO $trellis_install$
DECLARE
  newer int;
  boss_version int;
BEGIN
  PERFORM pg_advisory_xact_lock(${MIGRATE_LOCK_CLASS}, hashtext(${quoteLiteral(options.schema)}));
  IF to_regclass(${quoteLiteral(`${s}.migrations`)}) IS NULL AND to_regclass(${quoteLiteral(`${s}.job`)}) IS NOT NULL
     AND to_regclass(${quoteLiteral(`${s}.queue`)}) IS NOT NULL AND to_regclass(${quoteLiteral(`${s}.version`)}) IS NOT NULL THEN
    RAISE EXCEPTION 'schema % holds another Trellis instance''s background jobs (pg-boss): choose another catalog schema',
      ${quoteLiteral(options.schema)} USING ERRCODE = 'TRC01';
  END IF;
  CREATE SCHEMA IF NOT EXISTS ${s};
  CREATE TABLE IF NOT EXISTS ${s}.migrations (
    version int PRIMARY KEY,
    name text NOT NULL,
    breaking boolean NOT NULL DEFAULT false,
    applied_at timestamptz NOT NULL DEFAULT now()
  );
  SELECT max(version) INTO newer FROM ${s}.migrations WHERE version > ${latest} AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (${latest}): upgrade trellis-pg',
      ${quoteLiteral(options.schema)}, newer USING ERRCODE = 'TRI01';
  END IF;
${steps}
  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ${s} FROM PUBLIC;
  INSERT INTO ${s}.config (target_schema) VALUES (${quoteLiteral(options.targetSchema)})
    ON CONFLICT DO NOTHING;
${bossInstallStatements(jobsSchemaFor(options.schema), options.schema)}
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ${quoteIdent(jobsSchemaFor(options.schema))} FROM PUBLIC;
END
$trellis_install$;
`;
}
