/**
 * Trellis's own schema as SQL you run yourself: inside a drizzle-kit custom migration, a
 * Prisma migration or psql. The text is the same DO block `Trellis.migrate()` runs, so the
 * two mix freely: it is version-guarded (each migration runs once), serialised by an
 * advisory lock, atomic inside the transaction it runs in, and it refuses a schema that
 * holds a breaking migration newer than this version of trellis-pg.
 *
 * Also schema dumps (`trellis dump`): `dumpSchema()` and `appendDefinitions()`, which put
 * the definitions after a schema-only pg_dump so that loading it gives a database whose
 * worker builds every transform (README, "Schema dumps").
 * @packageDocumentation
 */

import { TrellisError } from '../engine/errors.js';
import { assertIdentifier } from '../engine/identifiers.js';
import { DEFAULTS } from '../engine/options.js';
import {
  installSql as engineInstallSql,
  latestVersion as engineLatestVersion,
  upgradeSql as engineUpgradeSql,
} from '../engine/schema/install-sql.js';

/** Options of {@link installSql}; the same names and defaults as `Trellis.connect`'s. */
export interface InstallSqlOptions {
  /**
   * The catalog schema to install or upgrade.
   * @defaultValue `'trellis'`
   */
  schema?: string;
  /**
   * Where the instance creates targets; recorded by the first install only. A handle
   * connecting with another `targetSchema` is refused.
   * @defaultValue `'public'`
   */
  targetSchema?: string;
}

/**
 * The idempotent install-or-upgrade SQL for one catalog schema, up to {@link latestVersion}.
 * Paste it into a migration (or print it with `trellis sql install`). Fails with a
 * `validation` TrellisError for a name Postgres would refuse or truncate.
 */
export function installSql(options: InstallSqlOptions = {}): string {
  const schema = options.schema ?? DEFAULTS.schema;
  const targetSchema = options.targetSchema ?? DEFAULTS.targetSchema;
  assertIdentifier('schema', schema);
  assertIdentifier('targetSchema', targetSchema);
  if (schema === targetSchema) {
    throw new TrellisError('validation', 'schema and targetSchema must differ');
  }
  return engineInstallSql({ schema, targetSchema });
}

/** Options of {@link upgradeSql}. */
export interface UpgradeSqlOptions extends InstallSqlOptions {
  /** The version the database is at (what its earlier migrations installed), at least 1. */
  from: number;
}

/**
 * The SQL that upgrades a catalog schema from version `from` to {@link latestVersion}:
 * only the migrations after `from`, version-guarded and locked as {@link installSql} is.
 * A database below `from` is refused (TRI01) with a hint naming what to run instead.
 * Fails with a `validation` TrellisError for a bad name or a `from` that is not an older
 * version (1 to latestVersion() - 1).
 */
export function upgradeSql(options: UpgradeSqlOptions): string {
  const schema = options.schema ?? DEFAULTS.schema;
  const targetSchema = options.targetSchema ?? DEFAULTS.targetSchema;
  assertIdentifier('schema', schema);
  assertIdentifier('targetSchema', targetSchema);
  const latest = engineLatestVersion();
  if (!Number.isInteger(options.from) || options.from < 1 || options.from >= latest) {
    throw new TrellisError(
      'validation',
      `an upgrade starts from an older schema version (1 to ${latest - 1}), not ${String(options.from)}`,
    );
  }
  return engineUpgradeSql({ schema, targetSchema, from: options.from });
}

/** The newest catalog schema version this version of trellis-pg installs. */
export function latestVersion(): number {
  return engineLatestVersion();
}

export type { PgDump } from './dump/find-pg-dump.js';
export type { DumpSchemaOptions, SchemaDump } from './dump/schema-dump.js';
export { appendDefinitions, dumpSchema, MAX_REDOS } from './dump/schema-dump.js';
