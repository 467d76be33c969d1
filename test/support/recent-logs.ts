import { appendFileSync } from 'node:fs';

/**
 * The engine's recent info, warning and error lines in this test process. Tests give handles a
 * logger that prints nothing (they assert on behaviour, not log lines); the lines are kept
 * here instead, and a failing test prints them (see leak-check.ts), so a failure in CI
 * says what the engine saw, not only what the test waited for.
 */
const KEEP = 300;
const lines: string[] = [];

/**
 * `TRELLIS_TEST_LOG_FILE=<path>` also appends every line, debug included, to that file:
 * for reading what the engine did in a run that passed too slowly or stalled.
 */
const LOG_FILE = process.env.TRELLIS_TEST_LOG_FILE || undefined;

function line(level: string, fields: object, message: string): string {
  return `${new Date().toISOString()} ${level} ${message} ${JSON.stringify(fields)}`;
}

function keep(level: string, fields: object, message: string): void {
  const text = line(level, fields, message);
  if (LOG_FILE) appendFileSync(LOG_FILE, `${text}\n`);
  lines.push(text);
  if (lines.length > KEEP) lines.splice(0, lines.length - KEEP);
}

/** Takes the lines kept since the last call. */
export function takeRecentLogs(): string[] {
  return lines.splice(0, lines.length);
}

/** A logger that prints nothing and keeps info, warnings and errors for a failing test. */
export const quietLogger = {
  debug(fields: object, message: string) {
    if (LOG_FILE) appendFileSync(LOG_FILE, `${line('debug', fields, message)}\n`);
  },
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
