import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import { installSql, latestVersion } from './install-sql.js';
import type { Migration } from './migration.js';
import { migrations as allMigrations } from './migrations.generated.js';

export interface SchemaState {
  /** Highest applied migration, 0 when the catalog schema is not installed. */
  version: number;
  /** Highest applied breaking migration this code does not know, if any. */
  newerBreaking: number | undefined;
  /** The instance's target schema, once installed. */
  targetSchema: string | undefined;
}

/** Reads what is installed in `schema`, without taking any lock. */
export async function readSchemaState(session: Session, schema: string): Promise<SchemaState> {
  const [found] = await session.query<{ has_migrations: boolean; has_config: boolean }>(
    `SELECT to_regclass($1) IS NOT NULL AS has_migrations, to_regclass($2) IS NOT NULL AS has_config`,
    [`${quoteIdent(schema)}.migrations`, `${quoteIdent(schema)}.config`],
  );
  if (!found?.has_migrations) {
    return { version: 0, newerBreaking: undefined, targetSchema: undefined };
  }
  const known = latestVersion();
  const [row] = await session.query<{ version: number | null; newer: number | null }>(
    `SELECT max(version) AS version, max(version) FILTER (WHERE version > $1 AND breaking) AS newer
       FROM ${quoteIdent(schema)}.migrations`,
    [known],
  );
  let targetSchema: string | undefined;
  if (found.has_config) {
    const [config] = await session.query<{ target_schema: string }>(
      `SELECT target_schema FROM ${quoteIdent(schema)}.config`,
    );
    targetSchema = config?.target_schema;
  }
  return { version: row?.version ?? 0, newerBreaking: row?.newer ?? undefined, targetSchema };
}

/** Refuses a schema holding a breaking migration newer than this code knows. */
export function assertCompatible(state: SchemaState, schema: string): void {
  if (state.newerBreaking !== undefined) {
    throw new TrellisError(
      'incompatible_schema',
      `the Trellis schema ${schema} is at breaking version ${state.newerBreaking}, newer than this trellis-pg knows (${latestVersion()}): upgrade trellis-pg`,
    );
  }
}

/** Refuses a handle whose targetSchema differs from the one the instance was installed with. */
export function assertTargetSchema(state: SchemaState, schema: string, targetSchema: string): void {
  if (state.targetSchema !== undefined && state.targetSchema !== targetSchema) {
    throw new TrellisError(
      'conflict',
      `the Trellis instance in schema ${schema} creates its targets in schema ${state.targetSchema}, not ${targetSchema}: connect with targetSchema: '${state.targetSchema}'`,
    );
  }
}

export interface MigrateResult {
  /** The version before, 0 for a fresh install. */
  from: number;
  to: number;
}

/** Installs or upgrades the catalog schema by running the same SQL `trellis sql install` prints. */
export async function migrateSchema(
  session: Session,
  options: { schema: string; targetSchema: string; migrations?: readonly Migration[] },
): Promise<MigrateResult> {
  const before = await readSchemaState(session, options.schema);
  assertCompatible(before, options.schema);
  assertTargetSchema(before, options.schema, options.targetSchema);
  await session.query(
    installSql({
      schema: options.schema,
      targetSchema: options.targetSchema,
      migrations: options.migrations ?? allMigrations,
    }),
  );
  const after = await readSchemaState(session, options.schema);
  assertTargetSchema(after, options.schema, options.targetSchema);
  return { from: before.version, to: after.version };
}
