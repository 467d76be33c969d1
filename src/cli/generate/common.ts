/**
 * What the `trellis generate …` commands share: their drizzle options, the folder's
 * settings, the name of the migration, and the line they print.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { TrellisError } from '../../engine/errors.js';
import { assertIdentifier } from '../../engine/identifiers.js';
import { DEFAULTS } from '../../engine/options.js';
import type { CliIo } from '../command.js';
import { type DrizzleSettings, readDrizzleSettings } from './drizzle-config.js';
import { writeCustomMigration } from './migration-folder.js';

export const GENERATE_OPTIONS = {
  config: { type: 'string' },
  out: { type: 'string' },
  name: { type: 'string' },
  schema: { type: 'string' },
  'target-schema': { type: 'string' },
} as const;

export const GENERATE_HELP = `  --config <file>         drizzle-kit config (default: drizzle.config.ts, .js or .json
                          here, as drizzle-kit finds it)
  --out <dir>             migrations folder (default: the config's out, else drizzle)
  --name <name>           migration name (the file is <prefix>_<name>.sql)
  --schema <name>         Trellis's catalog schema (default: trellis)
  --target-schema <name>  where targets are created (default: public)`;

export interface GenerateValues {
  config?: string | undefined;
  out?: string | undefined;
  name?: string | undefined;
  schema?: string | undefined;
  'target-schema'?: string | undefined;
}

export interface GenerateContext {
  settings: DrizzleSettings;
  schema: string;
  targetSchema: string;
}

export async function generateContext(values: GenerateValues): Promise<GenerateContext> {
  const schema = values.schema ?? DEFAULTS.schema;
  const targetSchema = values['target-schema'] ?? DEFAULTS.targetSchema;
  assertIdentifier('schema', schema);
  assertIdentifier('target-schema', targetSchema);
  const settings = await readDrizzleSettings({
    cwd: process.cwd(),
    configPath: values.config,
    out: values.out,
  });
  return { settings, schema, targetSchema };
}

/** A migration name as drizzle-kit would take it in a file name: letters, digits, `_`. */
export function migrationName(name: string): string {
  const clean = name
    .toLowerCase()
    .replace(/[^a-z0-9_]+/g, '_')
    .replace(/^_+|_+$/g, '')
    .slice(0, 60);
  if (clean === '') throw new TrellisError('validation', `"${name}" makes no migration name`);
  return clean;
}

/** Writes the migration and says where (relative to the current directory). */
export function writeAndReport(
  io: CliIo,
  context: GenerateContext,
  name: string,
  statements: string[],
): void {
  const written = writeCustomMigration(context.settings, migrationName(name), statements);
  io.out(
    `Wrote ${relative(process.cwd(), written.file) || written.file}: drizzle-kit migrate applies it\n`,
  );
}

/**
 * The versions that install migrations already in the folder upgrade `schema` to, read from
 * the first line of the install SQL (`… catalog schema "trellis" to version N.`).
 */
export function installedVersions(
  out: string,
  schema: string,
): Array<{ file: string; version: number }> {
  let files: string[];
  try {
    files = readdirSync(out).filter((f) => f.endsWith('.sql'));
  } catch {
    return [];
  }
  // An install's first line, or an upgrade's (which carries only the versions after one).
  const pattern =
    /^-- trellis-pg: (?:install or upgrade|upgrade) the Trellis catalog schema (.+?) (?:from version \d+ )?to version (\d+)\.$/m;
  const quoted = `"${schema.replaceAll('"', '""')}"`;
  const found: Array<{ file: string; version: number }> = [];
  for (const file of files.sort()) {
    const match = pattern.exec(readFileSync(join(out, file), 'utf8'));
    if (match && match[1] === quoted) found.push({ file, version: Number(match[2]) });
  }
  return found;
}
