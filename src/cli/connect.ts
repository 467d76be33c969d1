import { TrellisError } from '../engine/errors.js';
import type { Logger } from '../engine/logger.js';
import type { ConnectOptions } from '../engine/options.js';
import { Trellis } from '../engine/trellis.js';
import type { CliIo } from './command.js';
import type { ConnectionFlags } from './define-command.js';

/** The URL from --url, else DATABASE_URL. */
export function urlFrom(flags: ConnectionFlags, io: CliIo, command: string): string {
  const url = flags.url ?? io.env.DATABASE_URL;
  if (!url) {
    throw new TrellisError('validation', `${command} needs --url <postgres url> or DATABASE_URL`);
  }
  return url;
}

/** Warnings and errors to stderr, one line each; a one-shot command has nothing to say below that. */
export function stderrLogger(io: CliIo): Logger {
  const line =
    (level: string) =>
    (obj: Record<string, unknown>, msg: string): void => {
      const { trellis_instance: _, ...rest } = obj;
      const fields = Object.keys(rest).length > 0 ? ` ${JSON.stringify(rest)}` : '';
      io.err(`trellis: ${level}: ${msg}${fields}\n`);
    };
  return { debug() {}, info() {}, warn: line('warn'), error: line('error') };
}

/** Connects a handle for a command, from its connection flags. */
export function connectCli(
  flags: ConnectionFlags,
  io: CliIo,
  command: string,
  extra: Partial<ConnectOptions> = {},
): Promise<Trellis> {
  return Trellis.connect({
    url: urlFrom(flags, io, command),
    logger: stderrLogger(io),
    ...(flags.schema === undefined ? {} : { schema: flags.schema }),
    ...(flags.targetSchema === undefined ? {} : { targetSchema: flags.targetSchema }),
    ...extra,
  });
}

/** Prints a value as JSON (Dates as ISO strings), one document. */
export function printJson(io: CliIo, value: unknown): void {
  io.out(`${JSON.stringify(value, null, 2)}\n`);
}
