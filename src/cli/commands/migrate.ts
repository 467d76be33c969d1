import { parseArgs } from 'node:util';
import { TrellisError } from '../../engine/errors.js';
import { Trellis } from '../../engine/trellis.js';
import { type Command, INSTANCE_OPTIONS, parseCommandArgs } from '../command.js';

export const migrate: Command = {
  name: 'migrate',
  summary: 'install or upgrade Trellis’s schema in a database',
  help: `Usage: trellis migrate --url <postgres url> [--schema trellis] [--target-schema public]

Connects, installs or upgrades Trellis's catalog schema (Trellis.migrate()), prints
the version before and after, and disconnects. Safe to run again and concurrently.

Options:
  --url <url>             Postgres URL (default: $DATABASE_URL); TLS by sslmode in the URL
  --schema <name>         catalog schema (default: trellis)
  --target-schema <name>  where targets are created, recorded by the first install
                          (default: public)
`,
  async run(args, io) {
    const options = { ...INSTANCE_OPTIONS, url: { type: 'string' } } as const;
    const { values } = parseCommandArgs('migrate', () =>
      parseArgs({ args, options, strict: true, allowPositionals: false }),
    );
    const url = values.url ?? io.env.DATABASE_URL;
    if (!url) {
      throw new TrellisError('validation', 'migrate needs --url <postgres url> or DATABASE_URL');
    }
    await using trellis = await Trellis.connect({
      url,
      ...(values.schema === undefined ? {} : { schema: values.schema }),
      ...(values['target-schema'] === undefined ? {} : { targetSchema: values['target-schema'] }),
    });
    const { from, to } = await trellis.migrate();
    const { schema } = await trellis.config();
    const outcome = from === to ? 'already up to date' : 'migrated';
    io.out(`Trellis schema "${schema}": from version ${from} to version ${to} (${outcome})\n`);
  },
};
