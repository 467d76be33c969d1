/**
 * The logger a handle writes to: anything pino-compatible (`debug`, `info`, `warn`, `error`
 * taking a merge object and a message). Engine lines carry `trellis_instance` so several
 * handles in one process stay apart. A logger that throws is ignored: logging never crashes
 * the engine, and the engine never awaits the logger.
 */
export interface Logger {
  debug(obj: Record<string, unknown>, msg: string): void;
  info(obj: Record<string, unknown>, msg: string): void;
  warn(obj: Record<string, unknown>, msg: string): void;
  error(obj: Record<string, unknown>, msg: string): void;
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

/** Wraps a user logger so every line names its instance and a throwing logger is contained. */
export function instanceLogger(logger: Logger, instance: string): Logger {
  const safe =
    (level: LogLevel) =>
    (obj: Record<string, unknown>, msg: string): void => {
      try {
        logger[level]({ trellis_instance: instance, ...obj }, msg);
      } catch {
        // A broken logger must not take the engine down with it.
      }
    };
  return { debug: safe('debug'), info: safe('info'), warn: safe('warn'), error: safe('error') };
}
