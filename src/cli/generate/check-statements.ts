/**
 * Checks statements before `trellis generate transform` writes them into a migration.
 *
 * The grammar lives in Trellis's schema (SQL), so the check runs in a database, inside a
 * transaction that is always rolled back: nothing it does stays. In it, the migrations
 * drizzle-kit has not applied to that database yet run first (as `drizzle-kit migrate`
 * would run them), then Trellis's install SQL, then each statement through `apply()`. So a
 * statement is refused here exactly when the migration would fail on that database. When
 * the pending migrations cannot run there (a database of another branch, say), only the
 * grammar is checked, and the caller is told so.
 */
import type postgres from 'postgres';
import { classifyConnectError, classifyError } from '../../engine/db/classify.js';
import { createClient } from '../../engine/db/client.js';
import { parseConnectionUrl } from '../../engine/db/connection-config.js';
import { TrellisError } from '../../engine/errors.js';
import { quoteIdent } from '../../engine/identifiers.js';
import { installSql } from '../../migration/index.js';
import type { DrizzleSettings } from './drizzle-config.js';
import { journalMigrations } from './migration-folder.js';

/** A statement's parse tree, as `<schema>.parse_statement` returns it (what names it). */
export interface ParsedStatement {
  kind: string;
  /** TRANSFORM: the target. */
  target?: { name: string };
  /** Other statements: the transform they name. */
  transform?: string;
}

export interface CheckResult {
  parsed: ParsedStatement[];
  /** `database`: applied after the pending migrations; `grammar`: parsed only (see `note`). */
  checked: 'database' | 'grammar';
  note?: string;
}

class RollBack extends Error {}

export async function checkStatements(options: {
  url: string;
  schema: string;
  targetSchema: string;
  statements: string[];
  settings: Pick<DrizzleSettings, 'out' | 'migrationsSchema' | 'migrationsTable'>;
}): Promise<CheckResult> {
  const config = parseConnectionUrl(options.url);
  const client = createClient(options.url, { max: 1, onnotice: () => {} });
  let result: CheckResult | undefined;
  try {
    await client`SELECT 1`.catch((error: unknown) => {
      throw classifyConnectError(error, config);
    });
    await client
      .begin(async (tx) => {
        await tx.unsafe(`SET LOCAL statement_timeout = '60s'`);
        const pendingError = await runPending(tx, options.settings);
        await tx.unsafe(installSql({ schema: options.schema, targetSchema: options.targetSchema }));
        const s = quoteIdent(options.schema);
        const parsed: ParsedStatement[] = [];
        for (const [i, statement] of options.statements.entries()) {
          const [row] = await tx
            .unsafe<[{ ast: ParsedStatement }]>(`SELECT ${s}.parse_statement($1) AS ast`, [
              statement,
            ])
            .catch((error: unknown) => {
              throw located(classifyError(error), i, options.statements.length);
            });
          parsed.push(row.ast);
        }
        if (pendingError) {
          result = { parsed, checked: 'grammar', note: pendingError };
          throw new RollBack();
        }
        for (const [i, statement] of options.statements.entries()) {
          await tx.unsafe(`SELECT ${s}.apply($1)`, [statement]).catch((error: unknown) => {
            throw located(classifyError(error), i, options.statements.length);
          });
        }
        result = { parsed, checked: 'database' };
        throw new RollBack();
      })
      .catch((error: unknown) => {
        if (!(error instanceof RollBack)) throw error;
      });
  } finally {
    await client.end({ timeout: 2 });
  }
  if (!result) throw new TrellisError('unknown', 'the statement check ended without a result');
  return result;
}

/** Says which statement failed when there are several (a parse position is per statement). */
function located(error: TrellisError, index: number, count: number): TrellisError {
  if (count === 1) return error;
  return new TrellisError(error.code, `statement ${index + 1}: ${error.message}`, {
    cause: error.cause,
    ...(error.position === undefined ? {} : { position: error.position }),
    ...(error.sqlstate === undefined ? {} : { sqlstate: error.sqlstate }),
  });
}

/**
 * Runs the folder's migrations that drizzle-kit has not applied to this database, the way
 * its migrator picks them (journal entries newer than the last one it recorded). Returns
 * why they could not run, or undefined when they did (or none were pending).
 */
async function runPending(
  tx: postgres.TransactionSql,
  settings: Pick<DrizzleSettings, 'out' | 'migrationsSchema' | 'migrationsTable'>,
): Promise<string | undefined> {
  const migrations = journalMigrations(settings.out);
  const table = `${quoteIdent(settings.migrationsSchema)}.${quoteIdent(settings.migrationsTable)}`;
  const [exists] = await tx.unsafe<[{ ok: boolean }]>('SELECT to_regclass($1) IS NOT NULL AS ok', [
    table,
  ]);
  let lastApplied = -1;
  if (exists?.ok) {
    const [row] = await tx.unsafe<[{ at: string | null }]>(
      `SELECT max(created_at)::text AS at FROM ${table}`,
    );
    lastApplied = row?.at === null || row?.at === undefined ? -1 : Number(row.at);
  }
  const pending = migrations.filter((m) => m.entry.when > lastApplied);
  if (pending.length === 0) return undefined;
  await tx.unsafe('SAVEPOINT trellis_pending');
  for (const migration of pending) {
    for (const statement of migration.statements) {
      if (statement.trim() === '') continue;
      try {
        await tx.unsafe(statement);
      } catch (error) {
        await tx.unsafe('ROLLBACK TO SAVEPOINT trellis_pending');
        const message = error instanceof Error ? error.message : String(error);
        return `the migrations not applied to this database yet did not run here (${migration.entry.tag}: ${message}), so only the grammar was checked`;
      }
    }
  }
  return undefined;
}

/**
 * The parse trees of `statements` (`<schema>.parse_statement`), from the grammar of this
 * trellis-pg installed in a transaction on the database that is rolled back: nothing stays.
 */
export async function parseStatements(options: {
  url: string;
  schema: string;
  targetSchema: string;
  statements: string[];
}): Promise<Array<Record<string, unknown>>> {
  const config = parseConnectionUrl(options.url);
  const client = createClient(options.url, { max: 1, onnotice: () => {} });
  const parsed: Array<Record<string, unknown>> = [];
  try {
    await client`SELECT 1`.catch((error: unknown) => {
      throw classifyConnectError(error, config);
    });
    await client
      .begin(async (tx) => {
        await tx.unsafe(installSql({ schema: options.schema, targetSchema: options.targetSchema }));
        const s = quoteIdent(options.schema);
        for (const [i, statement] of options.statements.entries()) {
          const [row] = await tx
            .unsafe<[{ ast: Record<string, unknown> }]>(`SELECT ${s}.parse_statement($1) AS ast`, [
              statement,
            ])
            .catch((error: unknown) => {
              throw located(classifyError(error), i, options.statements.length);
            });
          parsed.push(row.ast);
        }
        throw new RollBack();
      })
      .catch((error: unknown) => {
        if (!(error instanceof RollBack)) throw error;
      });
  } finally {
    await client.end({ timeout: 2 });
  }
  return parsed;
}
