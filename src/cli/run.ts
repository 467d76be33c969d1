import { isTrellisError, TrellisError } from '../engine/errors.js';
import type { CliIo, Command } from './command.js';
import { check } from './commands/check.js';
import { migrate } from './commands/migrate.js';
import { sqlInstall } from './commands/sql-install.js';
import { packageVersion } from './version.js';

const COMMANDS: readonly Command[] = [sqlInstall, migrate, check];

function usage(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length));
  const list = COMMANDS.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`).join('\n');
  return `Usage: trellis <command> [options]

trellis-pg ${packageVersion()}: derived tables kept up to date incrementally, in your own Postgres.

Commands:
${list}

Options:
  -h, --help     show this help, or a command's (trellis <command> --help)
  -v, --version  print the version

Errors print "trellis: <message> (<code>)" to stderr and exit with status 1.
`;
}

/** The command named by the leading words of `argv`, and the arguments after them. */
function findCommand(argv: string[]): { command: Command; args: string[] } {
  for (const command of COMMANDS) {
    const words = command.name.split(' ');
    if (words.every((word, i) => argv[i] === word)) {
      return { command, args: argv.slice(words.length) };
    }
  }
  const group = COMMANDS.filter((c) => c.name.startsWith(`${argv[0]} `));
  if (group.length > 0) {
    const subcommands = group.map((c) => c.name.split(' ').slice(1).join(' ')).join(', ');
    throw new TrellisError(
      'validation',
      `"${argv[0]}" needs a subcommand: ${subcommands} (see trellis --help)`,
    );
  }
  throw new TrellisError('validation', `unknown command "${argv[0]}" (see trellis --help)`);
}

/** Runs the CLI; resolves to the exit status. Never throws. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  try {
    const [first] = argv;
    if (first === undefined || first === '-h' || first === '--help' || first === 'help') {
      io.out(usage());
      return 0;
    }
    if (first === '-v' || first === '--version') {
      io.out(`${packageVersion()}\n`);
      return 0;
    }
    const { command, args } = findCommand(argv);
    if (args.includes('-h') || args.includes('--help')) {
      io.out(command.help);
      return 0;
    }
    const status = await command.run(args, io);
    return typeof status === 'number' ? status : 0;
  } catch (error) {
    const code = isTrellisError(error) ? error.code : 'unknown';
    const message = error instanceof Error ? error.message : String(error);
    io.err(`trellis: ${message} (${code})\n`);
    return 1;
  }
}
