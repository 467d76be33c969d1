import { parseArgs } from 'node:util';
import { installSql } from '../../migration/index.js';
import { type Command, INSTANCE_OPTIONS, parseCommandArgs } from '../command.js';

export const sqlInstall: Command = {
  name: 'sql install',
  summary: 'print the SQL that installs or upgrades Trellis’s schema (for a migration)',
  help: `Usage: trellis sql install [--schema trellis] [--target-schema public]

Prints the SQL that installs Trellis's catalog schema, or upgrades it to this version
of trellis-pg. Paste it into a drizzle-kit custom migration (drizzle-kit generate
--custom), a Prisma migration or psql. It is the same SQL Trellis.migrate() runs:
safe to run again, safe beside migrate(), atomic inside the migration's transaction.

Options:
  --schema <name>         catalog schema (default: trellis)
  --target-schema <name>  where targets are created, recorded by the first install
                          (default: public)
`,
  async run(args, io) {
    const { values } = parseCommandArgs('sql install', () =>
      parseArgs({ args, options: INSTANCE_OPTIONS, strict: true, allowPositionals: false }),
    );
    io.out(
      installSql({
        ...(values.schema === undefined ? {} : { schema: values.schema }),
        ...(values['target-schema'] === undefined ? {} : { targetSchema: values['target-schema'] }),
      }),
    );
  },
};
