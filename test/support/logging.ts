import type { Logger } from '../../src/engine/index.js';

/** A line a test logger was handed, with when. */
export interface LoggedLine {
  level: keyof Logger;
  obj: Record<string, unknown>;
  msg: string;
  at: number;
}

/**
 * A pino-shaped logger that records every line in `lines`; `each` runs after each line and
 * what it returns is what the logger returns (a promise, for an async logger).
 */
export function recordingLogger(lines: LoggedLine[], each?: () => unknown): Logger {
  const at = (level: keyof Logger) => (obj: Record<string, unknown>, msg: string) => {
    lines.push({ level, obj, msg, at: Date.now() });
    return each?.();
  };
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}
