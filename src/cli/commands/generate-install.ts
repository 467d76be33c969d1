import { parseArgs } from 'node:util';
import { TrellisError } from '../../engine/errors.js';
import { installSql, latestVersion, upgradeSql } from '../../migration/index.js';
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

Writes a drizzle-kit custom migration with the SQL that upgrades the installed Trellis
schema to the one this trellis-pg ships, version ${latestVersion()}: only the schema
migrations after the version the folder's earlier Trellis migrations install (or
--from). It runs on a database at that version or newer; a database at an older one is
refused with what to run instead. Nothing is written when the folder's Trellis
migrations already reach version ${latestVersion()}. In a folder without one (the schema
was installed by migrate()), the whole install SQL is written, which upgrades from any
version.

Options:
${GENERATE_HELP}
  --from <version>        the schema version the database is at (default: the newest
                          version the folder's Trellis migrations install)
`,
  async run(args, io) {
    const { values } = parseCommandArgs('generate upgrade', () =>
      parseArgs({
        args,
        options: { ...GENERATE_OPTIONS, from: { type: 'string' } },
        strict: true,
        allowPositionals: false,
      }),
    );
    const context = await generateContext(values);
    const latest = latestVersion();
    const installed = installedVersions(context.settings.out, context.schema);
    const newest = installed.reduce<(typeof installed)[number] | undefined>(
      (max, m) => (max === undefined || m.version > max.version ? m : max),
      undefined,
    );
    let from: number | undefined = newest?.version;
    if (values.from !== undefined) {
      from = Number(values.from);
      if (!/^\d+$/.test(values.from) || from < 1) {
        throw new TrellisError('validation', `--from takes a schema version, not "${values.from}"`);
      }
    }
    if (from !== undefined && from >= latest) {
      io.out(
        newest && values.from === undefined
          ? `${newest.file} already brings the Trellis schema "${context.schema}" to version ${newest.version}: nothing written\n`
          : `the Trellis schema "${context.schema}" at version ${from} needs no upgrade to ${latest}: nothing written\n`,
      );
      return;
    }
    const sql =
      from === undefined
        ? installSql({ schema: context.schema, targetSchema: context.targetSchema })
        : upgradeSql({ schema: context.schema, targetSchema: context.targetSchema, from });
    writeAndReport(io, context, values.name ?? `trellis_upgrade_v${latest}`, [
      header('generate upgrade') + sql,
    ]);
  },
};
