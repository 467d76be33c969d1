import { parseArgs } from 'node:util';
import { applyStatementSql } from '../../drizzle/apply-sql.js';
import { TrellisError } from '../../engine/errors.js';
import { type Command, parseCommandArgs } from '../command.js';
import { targetsFromModule } from '../generate/builder-module.js';
import { checkStatements, type ParsedStatement } from '../generate/check-statements.js';
import {
  GENERATE_HELP,
  GENERATE_OPTIONS,
  generateContext,
  writeAndReport,
} from '../generate/common.js';
import { packageVersion } from '../version.js';

const OPTIONS = { ...GENERATE_OPTIONS, url: { type: 'string' }, from: { type: 'string' } } as const;

/** `trellis_transform_customer_totals`, `trellis_drop_x_and_2_more`. */
function defaultName(parsed: ParsedStatement[]): string {
  const [first] = parsed;
  const named = first?.target?.name ?? first?.transform ?? 'statement';
  const more = parsed.length > 1 ? `_and_${parsed.length - 1}_more` : '';
  return `trellis_${first?.kind ?? 'statement'}_${named}${more}`;
}

export const generateTransform: Command = {
  name: 'generate transform',
  summary: 'write a drizzle-kit migration that applies Trellis statements',
  help: `Usage: trellis generate transform "<statement>" ["<statement>" …] [options]
       trellis generate transform --from <module> [target …] [options]

Writes a drizzle-kit custom migration that applies each statement (TRANSFORM, DROP,
ALTER, PAUSE, RESUME) with SELECT <schema>.apply('…'), in drizzle-kit migrate's
transaction. With --from, the statements are those of the targets the module exports
(made with transform() from trellis-pg/drizzle): the targets named, or all of them,
a chain's upstream target first. A .ts module is read with tsx.

Each statement is checked before anything is written, in a transaction on the database
that is rolled back: the folder's migrations not applied there yet run first, then each
statement, so a statement is refused here when the migration would fail on that
database (parse errors give the position). When those migrations cannot run there,
only the grammar is checked, and a note says so.

Options:
  --url <url>             database to check on (default: $DATABASE_URL, else the
                          config's dbCredentials.url)
  --from <module>         take the statements from the targets this module exports
${GENERATE_HELP}
`,
  async run(args, io) {
    const { values, positionals } = parseCommandArgs('generate transform', () =>
      parseArgs({ args, options: OPTIONS, strict: true, allowPositionals: true }),
    );
    const statements =
      values.from === undefined
        ? positionals
        : (await targetsFromModule(process.cwd(), values.from, positionals)).map(
            (d) => d.statement,
          );
    if (statements.length === 0) {
      throw new TrellisError(
        'validation',
        'generate transform needs a statement, or --from <module> (see trellis generate transform --help)',
      );
    }
    const context = await generateContext(values);
    const url = values.url ?? io.env.DATABASE_URL ?? context.settings.url;
    if (!url) {
      throw new TrellisError(
        'validation',
        'generate transform checks statements on a database: pass --url, set DATABASE_URL, or give the drizzle config a dbCredentials.url',
      );
    }
    const checked = await checkStatements({
      url,
      schema: context.schema,
      targetSchema: context.targetSchema,
      statements,
      settings: context.settings,
    });
    if (checked.note) io.err(`trellis: note: ${checked.note}\n`);
    const header = `-- Written by \`trellis generate transform\` (trellis-pg ${packageVersion()}): Trellis statements,\n-- applied in drizzle-kit migrate's transaction. Install Trellis's schema in an earlier migration.\n`;
    const lines = statements.map(
      (s, i) => (i === 0 ? header : '') + applyStatementSql(s, { schema: context.schema }),
    );
    writeAndReport(io, context, values.name ?? defaultName(checked.parsed), lines);
  },
};
