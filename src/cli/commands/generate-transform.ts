import { parseArgs } from 'node:util';
import { applyStatementSql } from '../../drizzle/apply-sql.js';
import { TrellisError } from '../../engine/errors.js';
import { type CliIo, type Command, parseCommandArgs } from '../command.js';
import { targetsFromModule } from '../generate/builder-module.js';
import {
  checkStatements,
  type ParsedStatement,
  parseStatements,
} from '../generate/check-statements.js';
import {
  GENERATE_HELP,
  GENERATE_OPTIONS,
  type GenerateContext,
  generateContext,
  writeAndReport,
} from '../generate/common.js';
import { type Ast, diffTransforms } from '../generate/transform-diff.js';
import {
  previousTransforms,
  type TransformSnapshot,
  writeSnapshot,
} from '../generate/transform-snapshot.js';
import { packageVersion } from '../version.js';

const OPTIONS = {
  ...GENERATE_OPTIONS,
  url: { type: 'string' },
  from: { type: 'string' },
  check: { type: 'boolean' },
  'allow-drop': { type: 'boolean' },
  casing: { type: 'string' },
} as const;

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
transaction.

With --from, the migration holds what changed between the targets the module exports
(made with transform() from trellis-pg/drizzle; the targets named, or all of them) and
what the folder's migrations define (meta/_trellis_snapshot.json, kept beside
drizzle-kit's snapshots and written with the migration): new targets defined, changed
ones altered (ALTER … ADD | DROP COLUMN where that is the whole change, else DROP
TRANSFORM and defined again, with the chains reading them), removed ones dropped (with
--allow-drop only); a chain's upstream target first. Nothing is written when nothing
changed. A .ts module is read with tsx.

Each statement is checked before anything is written, in a transaction on the database
that is rolled back: the folder's migrations not applied there yet run first, then each
statement, so a statement is refused here when the migration would fail on that
database (parse errors give the position). When those migrations cannot run there,
only the grammar is checked, and a note says so.

Options:
  --url <url>             database to check on (default: $DATABASE_URL, else the
                          config's dbCredentials.url)
  --from <module>         write what changed in the targets this module exports
  --allow-drop            with --from: drop the targets the module no longer exports
  --check                 with --from: write nothing; exit 1 when the module and the
                          migrations disagree (for CI)
  --casing <casing>       with --from: snake_case or camelCase, how columns declared
                          without a name and the targets' columns are named, for
                          targets whose transform() names no casing (default: the
                          drizzle config's casing, as drizzle-kit names the tables)
${GENERATE_HELP}
`,
  async run(args, io) {
    const { values, positionals } = parseCommandArgs('generate transform', () =>
      parseArgs({ args, options: OPTIONS, strict: true, allowPositionals: true }),
    );
    if (values.from !== undefined) {
      return await fromModule(values, positionals, io);
    }
    const statements = positionals;
    if (statements.length === 0) {
      throw new TrellisError(
        'validation',
        'generate transform needs a statement, or --from <module> (see trellis generate transform --help)',
      );
    }
    const context = await generateContext(values);
    const url = databaseUrl(values, io, context);
    const checked = await checkStatements({
      url,
      schema: context.schema,
      targetSchema: context.targetSchema,
      statements,
      settings: context.settings,
    });
    if (checked.note) io.err(`trellis: note: ${checked.note}\n`);
    writeAndReport(
      io,
      context,
      values.name ?? defaultName(checked.parsed),
      migrationLines(statements, context.schema),
    );
  },
};

type Values = ReturnType<typeof parseArgs<{ options: typeof OPTIONS }>>['values'];

function databaseUrl(values: Values, io: CliIo, context: GenerateContext): string {
  const url = values.url ?? io.env.DATABASE_URL ?? context.settings.url;
  if (!url) {
    throw new TrellisError(
      'validation',
      'generate transform checks statements on a database: pass --url, set DATABASE_URL, or give the drizzle config a dbCredentials.url',
    );
  }
  return url;
}

function migrationLines(statements: string[], schema: string): string[] {
  const header = `-- Written by \`trellis generate transform\` (trellis-pg ${packageVersion()}): Trellis statements,\n-- applied in drizzle-kit migrate's transaction. Install Trellis's schema in an earlier migration.\n`;
  return statements.map((s, i) => (i === 0 ? header : '') + applyStatementSql(s, { schema }));
}

/**
 * `--from`: the difference between the module's targets and the folder's snapshot (ADR
 * 0048), checked on the database and written as one migration, with the snapshot.
 */
async function fromModule(values: Values, names: string[], io: CliIo): Promise<number> {
  const from = values.from as string;
  const context = await generateContext(values);
  const casing = values.casing ?? context.settings.casing;
  if (casing !== undefined && casing !== 'snake_case' && casing !== 'camelCase') {
    throw new TrellisError('validation', `--casing is snake_case or camelCase, not ${casing}`);
  }
  // A target whose transform() named no casing follows the drizzle config's, as the
  // tables' unnamed columns do (drizzle-kit names them by it).
  const declared = (await targetsFromModule(process.cwd(), from, names)).map((d) =>
    casing !== undefined && d.withCasing ? d.withCasing(casing) : d,
  );
  const { snapshot } = previousTransforms(context.settings.out, context.schema);
  // Targets named: only they are compared (nothing is removed).
  const previous =
    names.length === 0
      ? snapshot.transforms
      : Object.fromEntries(
          Object.entries(snapshot.transforms).filter(([name]) => names.includes(name)),
        );
  const differing = [
    ...declared.filter((d) => previous[d.target]?.statement !== d.statement).map((d) => d.target),
    ...Object.keys(previous).filter((name) => !declared.some((d) => d.target === name)),
  ].sort();
  if (values.check) {
    if (differing.length === 0) {
      io.out(`${from} and the migrations define the same transforms\n`);
      return 0;
    }
    io.err(
      `trellis: ${from} and the migrations disagree on ${differing.join(', ')}: run trellis generate transform --from ${from}\n`,
    );
    return 1;
  }
  if (differing.length === 0) {
    io.out('No transform changes: nothing written\n');
    return 0;
  }
  const url = databaseUrl(values, io, context);
  const texts = [
    ...new Set([
      ...declared.map((d) => d.statement),
      ...Object.values(previous).map((p) => p.statement),
    ]),
  ];
  const trees = await parseStatements({
    url,
    schema: context.schema,
    targetSchema: context.targetSchema,
    statements: texts,
  });
  const diff = diffTransforms({
    declared,
    previous,
    parsed: new Map(texts.map((t, i) => [t, trees[i] as Ast])),
    allowDrop: values['allow-drop'] === true,
  });
  const next: TransformSnapshot = {
    ...snapshot,
    transforms: { ...snapshot.transforms },
  };
  for (const name of diff.removed) delete next.transforms[name];
  for (const d of declared) next.transforms[d.target] = { statement: d.statement, reads: d.reads };
  if (diff.statements.length === 0) {
    // The statements' text changed, not what they mean.
    writeSnapshot(context.settings.out, next);
    io.out('No transform changes (the statements mean the same): nothing written\n');
    return 0;
  }
  const checked = await checkStatements({
    url,
    schema: context.schema,
    targetSchema: context.targetSchema,
    statements: diff.statements,
    settings: context.settings,
  });
  if (checked.note) io.err(`trellis: note: ${checked.note}\n`);
  writeAndReport(
    io,
    context,
    values.name ?? defaultName(checked.parsed),
    migrationLines(diff.statements, context.schema),
  );
  writeSnapshot(context.settings.out, next);
  io.out(`${diff.summary.join('\n')}\n`);
  return 0;
}
