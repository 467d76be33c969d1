/**
 * Reads the app's drizzle-kit config (`drizzle.config.ts` and friends), for the settings
 * `trellis generate` needs: where migrations go and how drizzle-kit names and splits them,
 * where drizzle-kit records applied migrations, and the database to check statements on.
 */
import { existsSync, readFileSync } from 'node:fs';
import { extname, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { TrellisError } from '../../engine/errors.js';

/** The drizzle-kit settings `trellis generate` uses, with drizzle-kit's defaults. */
export interface DrizzleSettings {
  /** The config file read, or null when `--out` stood in for one. */
  file: string | null;
  /** The migrations folder (absolute). */
  out: string;
  /** `--> statement-breakpoint` between statements. drizzle-kit's default: true. */
  breakpoints: boolean;
  /** How migration files are numbered: `migrations.prefix`, default `index`. */
  prefix: 'index' | 'timestamp' | 'supabase' | 'unix' | 'none';
  /** Where drizzle-kit records applied migrations (`migrations.schema`/`.table`). */
  migrationsSchema: string;
  migrationsTable: string;
  /** `dbCredentials.url`, when the config has one. */
  url: string | undefined;
  /**
   * `casing` (drizzle-kit's name for columns declared without one), when the config sets
   * it: `trellis generate transform --from` renders targets that name no casing with it.
   */
  casing: 'snake_case' | 'camelCase' | undefined;
}

/** The config files drizzle-kit finds on its own, in its order (and an ESM .mjs one). */
const DEFAULT_CONFIGS = [
  'drizzle.config.ts',
  'drizzle.config.js',
  'drizzle.config.json',
  'drizzle.config.mjs',
];
const PREFIXES = new Set(['index', 'timestamp', 'supabase', 'unix', 'none']);

interface RawConfig {
  dialect?: unknown;
  out?: unknown;
  breakpoints?: unknown;
  migrations?: { prefix?: unknown; schema?: unknown; table?: unknown };
  dbCredentials?: { url?: unknown };
  casing?: unknown;
}

/**
 * The settings from `configPath` (or drizzle-kit's default config file in `cwd`); with
 * `out` given and no config file found, drizzle-kit's defaults for that folder.
 */
export async function readDrizzleSettings(options: {
  cwd: string;
  configPath?: string | undefined;
  out?: string | undefined;
}): Promise<DrizzleSettings> {
  const file = options.configPath
    ? resolve(options.cwd, options.configPath)
    : DEFAULT_CONFIGS.map((f) => resolve(options.cwd, f)).find((f) => existsSync(f));
  if (options.configPath && !existsSync(file as string)) {
    throw new TrellisError('validation', `drizzle config ${file} does not exist`);
  }
  if (!file) {
    if (options.out === undefined) {
      throw new TrellisError(
        'validation',
        `no drizzle config here (${DEFAULT_CONFIGS.join(', ')} in ${options.cwd}): pass --config <file> or --out <migrations folder>`,
      );
    }
    return {
      file: null,
      out: resolve(options.cwd, options.out),
      breakpoints: true,
      prefix: 'index',
      migrationsSchema: 'drizzle',
      migrationsTable: '__drizzle_migrations',
      url: undefined,
      casing: undefined,
    };
  }
  const raw = await loadConfig(file);
  if (raw.dialect !== 'postgresql') {
    throw new TrellisError(
      'validation',
      `${file}: dialect is ${JSON.stringify(raw.dialect)}; Trellis needs 'postgresql'`,
    );
  }
  const prefix = raw.migrations?.prefix ?? 'index';
  if (typeof prefix !== 'string' || !PREFIXES.has(prefix)) {
    throw new TrellisError('validation', `${file}: unknown migrations.prefix ${String(prefix)}`);
  }
  if (raw.casing !== undefined && raw.casing !== 'snake_case' && raw.casing !== 'camelCase') {
    throw new TrellisError(
      'validation',
      `${file}: casing is ${JSON.stringify(raw.casing)}; drizzle-kit takes 'snake_case' or 'camelCase'`,
    );
  }
  const out = options.out ?? (typeof raw.out === 'string' ? raw.out : 'drizzle');
  const url = raw.dbCredentials?.url;
  return {
    file,
    // drizzle-kit resolves `out` from where it runs, as we do.
    out: resolve(options.cwd, out),
    breakpoints: raw.breakpoints === undefined ? true : raw.breakpoints === true,
    prefix: prefix as DrizzleSettings['prefix'],
    migrationsSchema:
      typeof raw.migrations?.schema === 'string' ? raw.migrations.schema : 'drizzle',
    migrationsTable:
      typeof raw.migrations?.table === 'string' ? raw.migrations.table : '__drizzle_migrations',
    url: typeof url === 'string' && url !== '' ? url : undefined,
    casing: raw.casing,
  };
}

async function loadConfig(file: string): Promise<RawConfig> {
  const ext = extname(file);
  if (ext === '.json') return JSON.parse(readFileSync(file, 'utf8')) as RawConfig;
  const module = (await importModule(file)) as { default?: unknown };
  let config = (module.default ?? module) as (RawConfig & { default?: RawConfig }) | undefined;
  // A .ts config in a CommonJS project comes back as CommonJS exports: { default: config }.
  if (config && typeof config === 'object' && !('dialect' in config) && config.default) {
    config = config.default;
  }
  if (typeof config !== 'object' || config === null) {
    throw new TrellisError('validation', `${file} does not export a drizzle-kit config`);
  }
  return config;
}

/**
 * Imports a module of the app's: TypeScript through tsx (which drizzle-kit itself depends
 * on, so a drizzle-kit project has it), JavaScript as it is.
 */
export async function importModule(file: string): Promise<unknown> {
  const url = pathToFileURL(file).href;
  if (!/\.[cm]?ts$/.test(file)) return import(url);
  let tsx: { tsImport(specifier: string, parent: string): Promise<unknown> };
  try {
    tsx = (await import('tsx/esm/api')) as typeof tsx;
  } catch (error) {
    throw new TrellisError(
      'validation',
      `reading ${file} needs tsx (drizzle-kit depends on it): npm install -D tsx`,
      { cause: error },
    );
  }
  return tsx.tsImport(url, import.meta.url);
}
