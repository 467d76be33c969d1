import { Command as Commander, CommanderError } from 'commander';
import { TrellisError } from '../engine/errors.js';
import type { CliIo, Command } from './command.js';

/** Options of every command that connects (`connects: true`). */
export interface ConnectionFlags {
  url?: string;
  schema?: string;
  targetSchema?: string;
}

/** Options of every command that can print JSON (`json: true`). */
export interface JsonFlag {
  json?: boolean;
}

export interface CommandSpec<O> {
  /** The words that name it (`status`, `sql install`). */
  name: string;
  /** One line for `trellis --help`. */
  summary: string;
  /** What it does, for its own help. */
  description: string;
  /** Adds --url, --schema and --target-schema. */
  connects?: boolean;
  /** Adds --json. */
  json?: boolean;
  /** Declares its arguments and other options. */
  setup?(command: Commander): void;
  /** Text after the options in its help (examples, exit statuses). */
  epilog?: string;
  run(context: { operands: string[]; options: O; io: CliIo }): Promise<void>;
}

/**
 * A command whose arguments commander parses (ADR 0021): its help is generated from the
 * same declarations, and a bad argument is a `validation` error pointing at that help.
 * What it returns is a plain `Command`, so run.ts treats it like any other.
 */
export function defineCommand<O>(spec: CommandSpec<O>): Command {
  const build = (): Commander => {
    const command = new Commander(`trellis ${spec.name}`)
      // Paragraphs are written wrapped in the source; commander wraps them to the terminal.
      .description(spec.description.replace(/([^\n])\n(?!\n)/g, '$1 '))
      .helpOption(false)
      .exitOverride()
      .configureOutput({ writeOut: () => {}, writeErr: () => {}, outputError: () => {} })
      .action(() => {});
    if (spec.connects) {
      command
        .option('--url <url>', 'Postgres URL (default: $DATABASE_URL); TLS by sslmode in the URL')
        .option('--schema <name>', "Trellis's catalog schema (default: trellis)")
        .option('--target-schema <name>', 'where targets are created (default: public)');
    }
    if (spec.json) command.option('--json', 'print JSON, for scripts');
    spec.setup?.(command);
    if (spec.epilog) command.addHelpText('after', `\n${spec.epilog}`);
    return command;
  };
  return {
    name: spec.name,
    summary: spec.summary,
    get help(): string {
      const command = build();
      const epilog = spec.epilog ? `\n${spec.epilog}\n` : '';
      return `${command.helpInformation()}${epilog}`;
    },
    async run(args, io) {
      const command = build();
      try {
        await command.parseAsync(args, { from: 'user' });
      } catch (error) {
        if (!(error instanceof CommanderError)) throw error;
        const message = error.message.replace(/^error: /, '');
        throw new TrellisError('validation', `${message} (see trellis ${spec.name} --help)`, {
          cause: error,
        });
      }
      await spec.run({ operands: command.args, options: command.opts() as O, io });
    },
  };
}

/** A failure that ends the CLI with an exit status of its own (not one of an error code). */
export class CliExit extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}
