import { LogBridge } from './observe/log-bridge.js';

/**
 * The logger a handle writes to: anything pino-compatible (`debug`, `info`, `warn`, `error`
 * taking a merge object and a message). Engine lines carry `trellis_instance` so several
 * handles in one process stay apart, and their values as fields (`target`, `address`,
 * `loop`, `code`, `sqlstate`, `durationMs`…) rather than in the text. Lines reach it
 * through a bounded buffer (see observe/log-bridge.ts): a logger that throws, is slow, or
 * returns a promise that takes its time never blocks or breaks the engine.
 */
export interface Logger {
  debug(obj: Record<string, unknown>, msg: string): unknown;
  info(obj: Record<string, unknown>, msg: string): unknown;
  warn(obj: Record<string, unknown>, msg: string): unknown;
  error(obj: Record<string, unknown>, msg: string): unknown;
}

export type LogLevel = keyof Logger;

const LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error'];

/** The default: warnings and errors to the console, one line each. */
export function consoleLogger(minLevel: LogLevel = 'warn'): Logger {
  const min = LEVELS.indexOf(minLevel);
  const line =
    (level: LogLevel) =>
    (obj: Record<string, unknown>, msg: string): void => {
      if (LEVELS.indexOf(level) < min) return;
      const fields = Object.entries(obj)
        .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
        .join(' ');
      const out = level === 'error' || level === 'warn' ? console.error : console.log;
      out(`[trellis] ${level} ${msg}${fields ? ` ${fields}` : ''}`);
    };
  return { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
}

/**
 * Wraps a user logger so every line names its instance, and reaches the logger through a
 * bounded buffer that a broken or slow logger cannot block (`onDropped` counts lines
 * dropped when it overflows).
 */
export function instanceLogger(
  logger: Logger,
  instance: string,
  bufferLines: number,
  onDropped?: (lines: number) => void,
): LogBridge {
  return new LogBridge(logger, { trellis_instance: instance }, onDropped, bufferLines);
}
