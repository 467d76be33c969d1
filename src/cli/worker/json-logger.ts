import type { Logger, LogLevel } from '../../engine/logger.js';

const LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error'];

/**
 * JSON lines, one object a line, as log shippers read them: `time` (ISO), `level`, `msg`,
 * then the line's fields (`trellis_instance` and the rest), to `write`. Lines below
 * `minLevel` are dropped. Errors are written as their message.
 */
export function jsonLineLogger(write: (line: string) => void, minLevel: LogLevel): Logger {
  const min = LEVELS.indexOf(minLevel);
  const line =
    (level: LogLevel) =>
    (obj: Record<string, unknown>, msg: string): void => {
      if (LEVELS.indexOf(level) < min) return;
      const fields = Object.fromEntries(
        Object.entries(obj).map(([k, v]) => [k, v instanceof Error ? v.message : v]),
      );
      write(`${JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields })}\n`);
    };
  return { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
}
