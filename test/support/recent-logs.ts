/**
 * The engine's recent warnings and errors in this test process. Tests give handles a
 * logger that prints nothing (they assert on behaviour, not log lines); the lines are kept
 * here instead, and a failing test prints them (see leak-check.ts), so a failure in CI
 * says what the engine saw, not only what the test waited for.
 */
const KEEP = 200;
const lines: string[] = [];

function keep(level: string, fields: object, message: string): void {
  lines.push(`${new Date().toISOString()} ${level} ${message} ${JSON.stringify(fields)}`);
  if (lines.length > KEEP) lines.splice(0, lines.length - KEEP);
}

/** Takes the lines kept since the last call. */
export function takeRecentLogs(): string[] {
  return lines.splice(0, lines.length);
}

/** A logger that prints nothing and keeps warnings and errors for a failing test. */
export const quietLogger = {
  debug() {},
  info() {},
  warn(fields: object, message: string) {
    keep('warn', fields, message);
  },
  error(fields: object, message: string) {
    keep('error', fields, message);
  },
};
