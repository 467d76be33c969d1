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

function versionSteps(migrations: readonly Migration[], schema: string): string {
  const s = quoteIdent(schema);
  return migrations
    .map((m) => {
      const body = dollarQuote(renderMigration(m, schema), `trellis_m${m.version}`);
      return `
  IF NOT EXISTS (SELECT 1 FROM ${s}.migrations WHERE version = ${m.version}) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO ${s}.migrations (version, name, breaking)
      VALUES (${m.version}, ${quoteLiteral(m.name)}, ${m.breaking});
    EXECUTE ${body};
  END IF;`;
    })
    .join('\n');
}

/** What every install or upgrade block ends with: privileges, the config row, the jobs schema. */
function closingStatements(options: { schema: string; targetSchema: string }): string {
  const s = quoteIdent(options.schema);
  return `  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ${s} FROM PUBLIC;
  INSERT INTO ${s}.config (target_schema) VALUES (${quoteLiteral(options.targetSchema)})
    ON CONFLICT DO NOTHING;
${bossInstallStatements(jobsSchemaFor(options.schema), options.schema)}
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ${quoteIdent(jobsSchemaFor(options.schema))} FROM PUBLIC;`;
}

/** Refuses a schema holding a breaking migration newer than `latest`. */
function newerBreakingGuard(schema: string, latest: number): string {
  const s = quoteIdent(schema);
  return `  SELECT max(version) INTO newer FROM ${s}.migrations WHERE version > ${latest} AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (${latest}): upgrade trellis-pg',
      ${quoteLiteral(schema)}, newer USING ERRCODE = 'TRI01';
  END IF;`;
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
${newerBreakingGuard(options.schema, latest)}
${versionSteps(migrations, options.schema)}
${closingStatements(options)}
END
$trellis_install$;
`;
}

export interface UpgradeSqlOptions extends InstallSqlOptions {
  /** The version the database is at: what the app's earlier migrations installed. */
  from: number;
}

/**
 * Upgrade SQL carrying only the migrations after `options.from` (ADR 0042): a DO block for
 * a schema at version `from` or newer, version-guarded and locked as the install is, so it
 * runs beside `migrate()` and twice harmlessly. A database below `from` (or without the
 * schema) is refused with what to run instead: its earlier migrations, or the whole
 * install SQL (`trellis sql install`, `migrate()`).
 */
export function upgradeSql(options: UpgradeSqlOptions): string {
  const migrations = options.migrations ?? allMigrations;
  const s = quoteIdent(options.schema);
  const latest = latestVersion(migrations);
  const { from } = options;
  if (!Number.isInteger(from) || from < 1 || from >= latest) {
    throw new Error(`an upgrade starts from a version between 1 and ${latest - 1}, not ${from}`);
  }
  const newer = migrations.filter((m) => m.version > from);
  const literal = quoteLiteral(options.schema);
  return `-- trellis-pg: upgrade the Trellis catalog schema ${s} from version ${from} to version ${latest}.
-- Only the migrations after version ${from}, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version ${from} is refused with what to run.
DO $trellis_upgrade$
DECLARE
  newer int;
  boss_version int;
  installed int := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(${MIGRATE_LOCK_CLASS}, hashtext(${literal}));
  IF to_regclass(${quoteLiteral(`${s}.migrations`)}) IS NOT NULL THEN
    SELECT coalesce(max(version), 0) INTO installed FROM ${s}.migrations;
  END IF;
  IF installed < ${from} THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version ${from} to ${latest}', ${literal}, installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version ${from} first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
${newerBreakingGuard(options.schema, latest)}
${versionSteps(newer, options.schema)}
${closingStatements(options)}
END
$trellis_upgrade$;
`;
}
