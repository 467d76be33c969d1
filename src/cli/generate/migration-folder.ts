/**
 * Writes a drizzle-kit custom migration the way `drizzle-kit generate --custom` does
 * (drizzle-kit 0.31, snapshot version 7): the `.sql` file, a journal entry, and a snapshot
 * that copies the previous one under a new id, so drizzle-kit's next `generate` diffs from
 * the same schema and `drizzle-kit migrate` runs the file in order, in its transaction.
 * test/generate.test.ts holds the output to what drizzle-kit itself writes.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TrellisError } from '../../engine/errors.js';
import type { DrizzleSettings } from './drizzle-config.js';

/** drizzle-kit's statement separator (written when `breakpoints` is on). */
export const BREAKPOINT = '--> statement-breakpoint\n';
const SNAPSHOT_VERSION = '7';
const ORIGIN_ID = '00000000-0000-0000-0000-000000000000';
/** The keys of drizzle-kit's snapshot schema (version 7), in its order. */
const SNAPSHOT_KEYS = [
  'version',
  'dialect',
  'tables',
  'enums',
  'schemas',
  'views',
  'sequences',
  'roles',
  'policies',
  '_meta',
  'internal',
] as const;
const DEFAULTED_KEYS = new Set(['views', 'sequences', 'roles', 'policies']);

export interface JournalEntry {
  idx: number;
  version: string;
  when: number;
  tag: string;
  breakpoints: boolean;
}

interface Journal {
  version: string;
  dialect: string;
  entries: JournalEntry[];
}

/** The snapshot drizzle-kit starts from in an empty folder (its `dryPg`), in its key order. */
function drySnapshot(): Record<string, unknown> {
  return {
    id: ORIGIN_ID,
    prevId: '',
    version: SNAPSHOT_VERSION,
    dialect: 'postgresql',
    tables: {},
    enums: {},
    schemas: {},
    views: {},
    sequences: {},
    roles: {},
    policies: {},
    _meta: { columns: {}, schemas: {}, tables: {} },
  };
}

export interface WrittenMigration {
  /** The `.sql` file written (absolute). */
  file: string;
  tag: string;
}

/** The migrations folder as drizzle-kit reads it: journal and snapshot files, in order. */
export function readFolder(out: string): { journal: Journal; snapshots: string[] } {
  const meta = join(out, 'meta');
  const journalPath = join(meta, '_journal.json');
  if (existsSync(out)) {
    // drizzle-kit refuses a folder of the pre-journal format (timestamp folders), and so do we.
    const old = readdirSync(out).filter((f) => f.length === 14 && /^\d+$/.test(f));
    if (old.length > 0) {
      throw new TrellisError(
        'validation',
        `${out} is in drizzle-kit's old folder format: run drizzle-kit up first`,
      );
    }
  }
  const journal: Journal = existsSync(journalPath)
    ? (JSON.parse(readFileSync(journalPath, 'utf8')) as Journal)
    : { version: SNAPSHOT_VERSION, dialect: 'postgresql', entries: [] };
  if (journal.dialect !== 'postgresql') {
    throw new TrellisError(
      'validation',
      `${journalPath} is for dialect ${journal.dialect}; Trellis needs postgresql`,
    );
  }
  const snapshots = existsSync(meta)
    ? readdirSync(meta)
        .filter((f) => !f.startsWith('_'))
        .map((f) => join(meta, f))
        .sort()
    : [];
  return { journal, snapshots };
}

/** Writes `statements` as the folder's next custom migration, named `name`. */
export function writeCustomMigration(
  settings: Pick<DrizzleSettings, 'out' | 'breakpoints' | 'prefix'>,
  name: string,
  statements: string[],
  now: Date = new Date(),
): WrittenMigration {
  const { out, breakpoints, prefix } = settings;
  const { journal, snapshots } = readFolder(out);
  const last = snapshots[snapshots.length - 1];
  const previous = last
    ? (JSON.parse(readFileSync(last, 'utf8')) as Record<string, unknown>)
    : drySnapshot();
  if (previous.version !== SNAPSHOT_VERSION) {
    throw new TrellisError(
      'validation',
      `${last} is a drizzle-kit snapshot of version ${String(previous.version)}, not ${SNAPSHOT_VERSION}: run drizzle-kit up first`,
    );
  }
  // drizzle-kit reads the previous snapshot through its schema (zod), which puts the keys
  // in its own order and defaults the newer ones; the copy is written in that order.
  const snapshot: Record<string, unknown> = { id: randomUUID(), prevId: previous.id };
  for (const key of SNAPSHOT_KEYS) {
    if (key in previous) snapshot[key] = previous[key];
    else if (DEFAULTED_KEYS.has(key)) snapshot[key] = {};
  }
  snapshot._meta = { columns: {}, schemas: {}, tables: {} };

  const lastEntry = journal.entries[journal.entries.length - 1];
  const idx = lastEntry === undefined ? 0 : lastEntry.idx + 1;
  const filePrefix = migrationPrefix(idx, prefix, now);
  const tag = `${filePrefix}_${name}`;
  const meta = join(out, 'meta');
  mkdirSync(meta, { recursive: true });
  const sqlFile = join(out, `${tag}.sql`);
  if (existsSync(sqlFile)) {
    throw new TrellisError('conflict', `${sqlFile} exists already`);
  }
  writeFileSync(join(meta, `${filePrefix}_snapshot.json`), JSON.stringify(snapshot, null, 2));
  journal.entries.push({
    idx,
    version: snapshot.version as string,
    when: now.getTime(),
    tag,
    breakpoints,
  });
  writeFileSync(join(meta, '_journal.json'), JSON.stringify(journal, null, 2));
  writeFileSync(sqlFile, statements.join(breakpoints ? BREAKPOINT : '\n'));
  return { file: sqlFile, tag };
}

/** drizzle-kit's file prefix for migration number `idx` (`migrations.prefix`). */
function migrationPrefix(idx: number, prefix: DrizzleSettings['prefix'], now: Date): string {
  switch (prefix) {
    case 'index':
      return idx.toFixed(0).padStart(4, '0');
    case 'timestamp':
    case 'supabase':
      return now
        .toISOString()
        .replace('T', '')
        .replaceAll('-', '')
        .replaceAll(':', '')
        .slice(0, 14);
    case 'unix':
      return String(Math.floor(now.getTime() / 1000));
    case 'none':
      return '';
  }
}

/** The SQL of each migration in the journal, in order, split into drizzle-kit's statements. */
export function journalMigrations(
  out: string,
): Array<{ entry: JournalEntry; statements: string[] }> {
  const { journal } = readFolder(out);
  return journal.entries.map((entry) => {
    const text = readFileSync(join(out, `${entry.tag}.sql`), 'utf8');
    return { entry, statements: text.split('--> statement-breakpoint') };
  });
}
