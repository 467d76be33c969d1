/**
 * What the folder's migrations define, for `trellis generate transform --from` to diff the
 * schema file against (ADR 0048): a snapshot kept beside drizzle-kit's, in its `meta`
 * folder, written with every migration `generate` writes from a module. Named with a
 * leading `_`, as drizzle-kit's own `_journal.json`: drizzle-kit takes every other file
 * there for one of its snapshots (the last one by name being the schema it diffs from).
 *
 * A folder whose transform migrations predate the snapshot has it made from them: each
 * `SELECT <schema>.apply('…')` line they hold, in journal order, a TRANSFORM defining its
 * target, an `ALTER TRANSFORM … AS` redefining it (ADR 0055) and a DROP TRANSFORM dropping
 * it (other statements, ALTERs of columns written by hand, are not followed: the next diff
 * writes such a target again when its statement differs).
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TrellisError } from '../../engine/errors.js';
import { journalMigrations } from './migration-folder.js';

export const SNAPSHOT_FILE = '_trellis_snapshot.json';
const SNAPSHOT_VERSION = 1;

export interface SnapshotTransform {
  /** The TRANSFORM statement, as the module declared it. */
  statement: string;
  /** Targets of other transforms it reads. */
  reads: string[];
}

export interface TransformSnapshot {
  version: number;
  /** Trellis's catalog schema the statements are applied in. */
  schema: string;
  /** By target name. */
  transforms: Record<string, SnapshotTransform>;
}

export function snapshotPath(out: string): string {
  return join(out, 'meta', SNAPSHOT_FILE);
}

/** The snapshot, or what the folder's migrations define when there is none yet. */
export function previousTransforms(
  out: string,
  schema: string,
): { snapshot: TransformSnapshot; kept: boolean } {
  const path = snapshotPath(out);
  if (existsSync(path)) {
    const snapshot = JSON.parse(readFileSync(path, 'utf8')) as TransformSnapshot;
    if (snapshot.version !== SNAPSHOT_VERSION) {
      throw new TrellisError(
        'validation',
        `${path} is a Trellis snapshot of version ${String(snapshot.version)}, not ${SNAPSHOT_VERSION}: upgrade trellis-pg`,
      );
    }
    if (snapshot.schema !== schema) {
      throw new TrellisError(
        'validation',
        `${path} is for Trellis schema "${snapshot.schema}", not "${schema}": pass --schema ${snapshot.schema}`,
      );
    }
    return { snapshot, kept: true };
  }
  return { snapshot: fromMigrations(out, schema), kept: false };
}

export function writeSnapshot(out: string, snapshot: TransformSnapshot): void {
  mkdirSync(join(out, 'meta'), { recursive: true });
  const sorted: Record<string, SnapshotTransform> = {};
  for (const name of Object.keys(snapshot.transforms).sort()) {
    sorted[name] = snapshot.transforms[name] as SnapshotTransform;
  }
  writeFileSync(
    snapshotPath(out),
    `${JSON.stringify({ ...snapshot, version: SNAPSHOT_VERSION, transforms: sorted }, null, 2)}\n`,
  );
}

/** `SELECT "trellis".apply('…');` as applyStatementSql writes it: the statement. */
const APPLY = /SELECT\s+("(?:[^"]|"")+"|[A-Za-z_][\w$]*)\.apply\(\s*'((?:[^']|'')*)'\s*\)/g;
/** A name as the grammar reads it: quoted as written, else folded to lower case. */
const NAME = String.raw`("(?:[^"]|"")+"|[A-Za-z_][\w$]*)`;
const DEFINE = new RegExp(String.raw`^\s*TRANSFORM\s+${NAME}`, 'i');
const DROP = new RegExp(String.raw`^\s*DROP\s+TRANSFORM\s+${NAME}`, 'i');
const REDEFINE = new RegExp(String.raw`^\s*ALTER\s+TRANSFORM\s+${NAME}(\s+)AS(\s+)`, 'i');

export function unquoteName(name: string): string {
  return name.startsWith('"') ? name.slice(1, -1).replaceAll('""', '"') : name.toLowerCase();
}

function fromMigrations(out: string, schema: string): TransformSnapshot {
  const transforms: Record<string, SnapshotTransform> = {};
  for (const { statements } of journalMigrations(out)) {
    for (const sql of statements) {
      for (const match of sql.matchAll(APPLY)) {
        if (unquoteName(match[1] as string) !== schema) continue;
        const statement = (match[2] as string).replaceAll("''", "'");
        const dropped = DROP.exec(statement);
        const defined = DEFINE.exec(statement);
        const redefined = REDEFINE.exec(statement);
        if (dropped) delete transforms[unquoteName(dropped[1] as string)];
        else if (defined) transforms[unquoteName(defined[1] as string)] = { statement, reads: [] };
        else if (redefined) {
          // The TRANSFORM statement it redefines the target to, as `redefinition` wrote it.
          const [head, name, before, after] = redefined as unknown as string[];
          const rest = statement.slice((head as string).length);
          transforms[unquoteName(name as string)] = {
            statement: /^FROM\s/i.test(rest)
              ? `TRANSFORM ${name}${after}${rest}`
              : `TRANSFORM ${name}${before}AS${after}${rest}`,
            reads: [],
          };
        }
      }
    }
  }
  return { version: SNAPSHOT_VERSION, schema, transforms };
}
