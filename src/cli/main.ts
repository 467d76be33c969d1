#!/usr/bin/env node
// The `trellis` command. The work is in run.ts; this file only binds it to the process:
// its streams, its terminal and its signals. SIGINT or SIGTERM ends a command at once,
// unless it listens on `io.stop` (worker, status --watch): then the first signal asks it
// to stop gracefully, and a second one ends the process.
import { getEventListeners } from 'node:events';
import { runCli } from './run.js';

const stop = new AbortController();
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stop.signal.aborted || getEventListeners(stop.signal, 'abort').length === 0) {
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }
    stop.abort(signal);
  });
}

process.exitCode = await runCli(process.argv.slice(2), {
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
  env: process.env,
  isTTY: process.stderr.isTTY === true,
  tty: process.stdout.isTTY ? process.stdout : undefined,
  stop: stop.signal,
});
