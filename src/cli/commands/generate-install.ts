import { parseArgs } from 'node:util';
import { TrellisError } from '../../engine/errors.js';
import { installSql, latestVersion } from '../../migration/index.js';
import { type Command, parseCommandArgs } from '../command.js';
import {
  GENERATE_HELP,
  GENERATE_OPTIONS,
  generateContext,
  installedVersions,
  writeAndReport,
} from '../generate/common.js';
import { packageVersion } from '../version.js';

function header(command: string): string {
  return `-- Written by \`trellis ${command}\` (trellis-pg ${packageVersion()}).\n`;
}

export const generateInstall: Command = {
  name: 'generate install',
  summary: 'write a drizzle-kit migration that installs Trellis’s schema',
  help: `Usage: trellis generate install [options]

Writes a drizzle-kit custom migration (the .sql file, its journal entry and snapshot,
as drizzle-kit generate --custom writes them) into the migrations folder of the
drizzle-kit config, holding the SQL that installs Trellis's catalog schema. drizzle-kit
migrate runs it in its transaction, with the migrations around it. Refused when the
folder already has one for the schema: after upgrading trellis-pg, use
trellis generate upgrade.

Options:
${GENERATE_HELP}
`,
  async run(args, io) {
    const { values } = parseCommandArgs('generate install', () =>
      parseArgs({ args, options: GENERATE_OPTIONS, strict: true, allowPositionals: false }),
    );
    const context = await generateContext(values);
    const existing = installedVersions(context.settings.out, context.schema);
    if (existing.length > 0) {
      throw new TrellisError(
        'conflict',
        `${existing[0]?.file} already installs the Trellis schema "${context.schema}": after upgrading trellis-pg, run trellis generate upgrade`,
      );
    }
    const sql = installSql({ schema: context.schema, targetSchema: context.targetSchema });
    writeAndReport(io, context, values.name ?? 'trellis_install', [
      header('generate install') + sql,
    ]);
  },
};

export const generateUpgrade: Command = {
  name: 'generate upgrade',
  summary: 'write a drizzle-kit migration that upgrades Trellis’s schema to this version',
  help: `Usage: trellis generate upgrade [options]

Writes a drizzle-kit custom migration with the SQL that upgrades an installed Trellis
schema (from any older version) to the one this trellis-pg ships, version ${latestVersion()}.
Nothing is written when the folder's newest Trellis migration for the schema is already
at that version.

Options:
${GENERATE_HELP}
`,
  async run(args, io) {
    const { values } = parseCommandArgs('generate upgrade', () =>
      parseArgs({ args, options: GENERATE_OPTIONS, strict: true, allowPositionals: false }),
    );
    const context = await generateContext(values);
    const latest = latestVersion();
    const newest = installedVersions(context.settings.out, context.schema).at(-1);
    if (newest && newest.version >= latest) {
      io.out(
        `${newest.file} already brings the Trellis schema "${context.schema}" to version ${newest.version}: nothing written\n`,
      );
      return;
    }
    const sql = installSql({ schema: context.schema, targetSchema: context.targetSchema });
    writeAndReport(io, context, values.name ?? `trellis_upgrade_v${latest}`, [
      header('generate upgrade') + sql,
    ]);
  },
};
