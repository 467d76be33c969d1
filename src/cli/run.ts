import { isTrellisError, TrellisError } from '../engine/errors.js';
import { latestVersion } from '../engine/schema/install-sql.js';
import type { CliIo, Command } from './command.js';
import { apply } from './commands/apply.js';
import { check } from './commands/check.js';
import { definitions } from './commands/definitions.js';
import { dump } from './commands/dump.js';
import { explain } from './commands/explain.js';
import { generateInstall, generateUpgrade } from './commands/generate-install.js';
import { generateTransform } from './commands/generate-transform.js';
import { migrate } from './commands/migrate.js';
import { quarantine } from './commands/quarantine.js';
import { release } from './commands/release.js';
import { sqlInstall } from './commands/sql-install.js';
import { status } from './commands/status.js';
import { worker } from './commands/worker.js';
import { CliExit } from './define-command.js';
import { EXIT_CODES, EXIT_CODES_HELP, exitCodeFor } from './exit-codes.js';
import { packageVersion } from './version.js';

/** Every command, one file each under commands/; `trellis --help` lists them in this order. */
const COMMANDS: readonly Command[] = [
  status,
  apply,
  definitions,
  explain,
  quarantine,
  release,
  check,
  worker,
  dump,
  generateInstall,
  generateTransform,
  generateUpgrade,
  migrate,
  sqlInstall,
];

function usage(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length));
  const list = COMMANDS.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`).join('\n');
  return `Usage: trellis <command> [options]

trellis-pg ${packageVersion()}: derived tables kept up to date incrementally, in your own Postgres.

Commands:
${list}

Options:
  -h, --help     show this help, or a command's (trellis <command> --help)
  -v, --version  print the version, and the catalog schema version it needs

Commands that connect take --url <postgres url> (default: $DATABASE_URL), and most take
--json for scripts. Errors print "trellis: <message> (<code>)" to stderr.

${EXIT_CODES_HELP}
`;
}

/** The commands whose name starts with `word` and more (`generate install`, …). */
function groupOf(word: string | undefined): Command[] {
  return COMMANDS.filter((c) => c.name.startsWith(`${word} `));
}

/** The help of a command group (`trellis generate --help`): its subcommands. */
function groupHelp(word: string, group: Command[]): string {
  const width = Math.max(...group.map((c) => c.name.length));
  const list = group.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`).join('\n');
  return `Usage: trellis ${word} <subcommand> [options]

Subcommands:
${list}

Each prints its own help: trellis ${group[0]?.name} --help
`;
}

/** The command named by the leading words of `argv`, and the arguments after them. */
function findCommand(argv: string[]): { command: Command; args: string[] } {
  // Longest name first: `sql install` before a command named `sql`, were there one.
  const byLength = [...COMMANDS].sort((a, b) => b.name.length - a.name.length);
  for (const command of byLength) {
    const words = command.name.split(' ');
    if (words.every((word, i) => argv[i] === word)) {
      return { command, args: argv.slice(words.length) };
    }
  }
  const group = groupOf(argv[0]);
  if (group.length > 0) {
    const subcommands = group.map((c) => c.name.split(' ').slice(1).join(' ')).join(', ');
    throw new TrellisError(
      'validation',
      `"${argv[0]}" needs a subcommand: ${subcommands} (see trellis --help)`,
    );
  }
  throw new TrellisError('validation', `unknown command "${argv[0]}" (see trellis --help)`);
}

/**
 * The engine's messages name the handle's methods (`run migrate()`); a CLI user needs the
 * command that does the same.
 */
function forCli(message: string): string {
  return message
    .replaceAll('run migrate()', 'run `trellis migrate`')
    .replaceAll('before connecting with staging: true', 'before starting workers');
}

/** Runs the CLI; resolves to the exit status (see EXIT_CODES). Never throws. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  try {
    const [first] = argv;
    if (first === undefined || first === '-h' || first === '--help' || first === 'help') {
      io.out(usage());
      return EXIT_CODES.ok;
    }
    if (first === '-v' || first === '--version') {
      io.out(`${packageVersion()} (catalog schema version ${latestVersion()})\n`);
      return EXIT_CODES.ok;
    }
    // A group's own help: `trellis generate --help` (or `trellis generate help`).
    const group = groupOf(first);
    const second = argv[1];
    if (group.length > 0 && (second === '-h' || second === '--help' || second === 'help')) {
      io.out(groupHelp(first, group));
      return EXIT_CODES.ok;
    }
    const { command, args } = findCommand(argv);
    // Options after `--` belong to someone else (trellis dump passes them to pg_dump).
    const own = args.includes('--') ? args.slice(0, args.indexOf('--')) : args;
    if (own.includes('-h') || own.includes('--help')) {
      io.out(command.help);
      return EXIT_CODES.ok;
    }
    const status = await command.run(args, io);
    return typeof status === 'number' ? status : EXIT_CODES.ok;
  } catch (error) {
    if (error instanceof CliExit) {
      io.err(`trellis: ${error.message}\n`);
      return error.status;
    }
    const code = isTrellisError(error) ? error.code : 'unknown';
    const message = error instanceof Error ? error.message : String(error);
    io.err(`trellis: ${forCli(message)} (${code})\n`);
    return exitCodeFor(code);
  }
}
