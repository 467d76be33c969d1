import { spawn } from 'node:child_process';
import { appendFile, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TrellisError } from '../../engine/errors.js';
import { DEFAULTS } from '../../engine/options.js';
import { Trellis } from '../../engine/trellis.js';
import { findPgDump, type PgDump } from './find-pg-dump.js';
import { checkPgDumpArgs } from './pg-dump-args.js';

/** How many times a dump is redone when a define or drop committed while it ran. */
export const MAX_REDOS = 3;

export interface DumpSchemaOptions {
  /** The database to dump (libpq URL; TLS by sslmode in it, as for `Trellis.connect`). */
  url: string;
  /** Trellis's catalog schema. @defaultValue `'trellis'` */
  schema?: string;
  /** Where the instance's targets are (as for `Trellis.connect`). @defaultValue `'public'` */
  targetSchema?: string;
  /** Arguments passed on to pg_dump (`-n`, `-N`, `-T`, `--no-owner`…); checked first. */
  pgDumpArgs?: readonly string[];
  /** The pg_dump to run. @defaultValue the one matching the server (see `findPgDump`) */
  pgDump?: string;
  /** Told before each redo, with the number of the attempt about to start (2, 3, 4). */
  onRedo?: (attempt: number) => void;
}

export interface SchemaDump {
  /** The schema-only dump, then the definitions as SQL. */
  sql: string;
  /** How many times pg_dump ran (1 unless definitions changed while it ran). */
  attempts: number;
  pgDump: PgDump;
}

/**
 * `trellis dump`: a schema-only pg_dump of the database with Trellis's definitions
 * appended, so loading it into an empty database gives one whose worker builds every
 * transform. The definitions are read before and after pg_dump; when a define or drop
 * committed in between (they differ), the dump is redone, up to MAX_REDOS times, so the
 * file's DDL and definitions agree. pg_dump 17's `CREATE SCHEMA public;` becomes
 * `CREATE SCHEMA IF NOT EXISTS public;`, which loads into a database that has it.
 */
export async function dumpSchema(options: DumpSchemaOptions): Promise<SchemaDump> {
  const schema = options.schema ?? DEFAULTS.schema;
  const args = options.pgDumpArgs ?? [];
  checkPgDumpArgs(args, schema);
  await using trellis = await Trellis.connect({
    url: options.url,
    schema,
    ...(options.targetSchema === undefined ? {} : { targetSchema: options.targetSchema }),
    logger: { debug() {}, info() {}, warn() {}, error() {} },
  });
  const serverMajor = Math.floor((await trellis.serverVersionNum()) / 10_000);
  const pgDump = await findPgDump(serverMajor, options.pgDump);
  for (let attempt = 1; attempt <= MAX_REDOS + 1; attempt += 1) {
    if (attempt > 1) options.onRedo?.(attempt);
    const before = await trellis.dumpDefinitionsSql();
    const ddl = await runPgDump(pgDump, options.url, args);
    const after = await trellis.dumpDefinitionsSql();
    if (before === after) {
      return { sql: `${withPublicIfNotExists(ddl)}${after}`, attempts: attempt, pgDump };
    }
  }
  throw new TrellisError(
    'conflict',
    `transforms were defined, altered or dropped while each of ${MAX_REDOS + 1} pg_dump runs ran, so no dump has DDL and definitions that agree: dump again when they settle`,
  );
}

/**
 * Appends the definitions of the database `trellis` is connected to, to a schema-only dump
 * someone else wrote (`pg_dump --schema-only`, a framework's structure dump). The
 * definitions are read once, now: a define or drop that raced that dump is not seen, so
 * dump and append while no one defines (`trellis dump` checks this itself).
 */
export async function appendDefinitions(file: string, trellis: Trellis): Promise<void> {
  const sql = await trellis.dumpDefinitionsSql();
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (error) {
    throw new TrellisError(
      'not_found',
      `cannot read the dump ${file}: ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
  await appendFile(file, text.length === 0 || text.endsWith('\n') ? sql : `\n${sql}`);
}

/** pg_dump 17+ writes `CREATE SCHEMA public;` when it dumps public by name. */
export function withPublicIfNotExists(ddl: string): string {
  const fixed = ddl.replace(/^CREATE SCHEMA public;$/gm, 'CREATE SCHEMA IF NOT EXISTS public;');
  return fixed.endsWith('\n') ? fixed : `${fixed}\n`;
}

/**
 * Runs pg_dump --schema-only into a temporary file and returns what it wrote. The password
 * goes in PGPASSWORD, never on the command line (other users can read that).
 */
async function runPgDump(pgDump: PgDump, url: string, args: readonly string[]): Promise<string> {
  const parsed = new URL(url);
  const password = decodeURIComponent(parsed.password);
  parsed.password = '';
  const dir = await mkdtemp(join(tmpdir(), 'trellis-dump-'));
  const file = join(dir, 'schema.sql');
  try {
    await new Promise<void>((resolve, reject) => {
      const child = spawn(
        pgDump.path,
        ['--schema-only', `--file=${file}`, ...args, `--dbname=${parsed.toString()}`],
        {
          env: { ...process.env, ...(password ? { PGPASSWORD: password } : {}) },
          stdio: ['ignore', 'ignore', 'pipe'],
        },
      );
      let err = '';
      child.stderr.on('data', (chunk: Buffer) => {
        err += chunk.toString();
      });
      child.on('error', (error) =>
        reject(
          new TrellisError('unknown', `cannot run ${pgDump.path}: ${error.message}`, {
            cause: error,
          }),
        ),
      );
      child.on('close', (code) => {
        if (code === 0) return resolve();
        reject(
          new TrellisError(
            'database',
            `pg_dump (${pgDump.path}) failed with exit status ${code}: ${err.trim()}`,
          ),
        );
      });
    });
    return await readFile(file, 'utf8');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
