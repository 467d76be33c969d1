/**
 * The engine's recent info, warning and error lines in this test process. Tests give handles a
 * logger that prints nothing (they assert on behaviour, not log lines); the lines are kept
 * here instead, and a failing test prints them (see leak-check.ts), so a failure in CI
 * says what the engine saw, not only what the test waited for.
 */
const KEEP = 300;
const lines: string[] = [];

function keep(level: string, fields: object, message: string): void {
  lines.push(`${new Date().toISOString()} ${level} ${message} ${JSON.stringify(fields)}`);
  if (lines.length > KEEP) lines.splice(0, lines.length - KEEP);
}

/** Takes the lines kept since the last call. */
export function takeRecentLogs(): string[] {
  return lines.splice(0, lines.length);
}

/** A logger that prints nothing and keeps info, warnings and errors for a failing test. */
export const quietLogger = {
  debug() {},
  info(fields: object, message: string) {
    keep('info', fields, message);
  },
  warn(fields: object, message: string) {
    keep('warn', fields, message);
  },
  error(fields: object, message: string) {
    keep('error', fields, message);
  },
};
