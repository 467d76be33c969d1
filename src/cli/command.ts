import type { ParseArgsConfig } from 'node:util';
import { TrellisError } from '../engine/errors.js';

/** Where a command writes and what it reads from the environment (a test can fake both). */
export interface CliIo {
  out(text: string): void;
  err(text: string): void;
  env: Readonly<Record<string, string | undefined>>;
  /** Whether stderr is a terminal (progress is drawn there only then). */
  isTTY?: boolean;
  /**
   * stdout, when it is a terminal: commands may then redraw in place and use colours
   * (unless NO_COLOR is set). Absent when piped, and in tests.
   */
  tty?: NodeJS.WriteStream | undefined;
  /**
   * Aborted when the user asks the process to stop (SIGINT, SIGTERM): long-running
   * commands (`worker`, `status --watch`) finish gracefully then. A second signal ends the
   * process at once (main.ts).
   */
  stop?: AbortSignal | undefined;
}

export interface Command {
  /** The words that name it, e.g. `sql install`. */
  name: string;
  /** One line for `trellis --help`. */
  summary: string;
  /** Its own help text, for `trellis <command> --help`. */
  help: string;
  /**
   * Runs it; failures throw (a `TrellisError` for anything the user can fix). May resolve
   * to an exit status (a number; anything else means 0).
   */
  run(args: string[], io: CliIo): Promise<unknown>;
}

/** Options every command that touches an instance takes. */
export const INSTANCE_OPTIONS = {
  schema: { type: 'string' },
  'target-schema': { type: 'string' },
} as const satisfies ParseArgsConfig['options'];

/**
 * Runs `node:util` `parseArgs` (strict, no positionals) for a command, with its errors
 * turned into `validation` errors that point at the command's help.
 */
export function parseCommandArgs<T>(command: string, parse: () => T): T {
  try {
    return parse();
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    throw new TrellisError('validation', `${message} (see trellis ${command} --help)`, {
      cause: error,
    });
  }
}
