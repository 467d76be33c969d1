import { setTimeout as sleep } from 'node:timers/promises';
import { createLogUpdate } from 'log-update';
import type { Lifecycle, Status } from '../../engine/catalog/status-types.js';
import type { Trellis } from '../../engine/trellis.js';
import type { CliIo } from '../command.js';
import { readStatuses } from './read.js';
import { renderLine, renderTable } from './render.js';

export interface WatchOptions {
  target: string | undefined;
  intervalMs: number;
  json: boolean;
  /** Stop once every transform shown is at this lifecycle. */
  until: Lifecycle | undefined;
  color: boolean;
}

/**
 * `trellis status --watch`: reads the statuses every `intervalMs` until stopped (SIGINT,
 * SIGTERM) or `until` holds. On a terminal the table is redrawn in place (log-update);
 * piped, each transform gets a timestamped plain line whenever it changes; with --json,
 * one JSON document a line per read.
 */
export async function watchStatus(
  trellis: Trellis,
  io: CliIo,
  options: WatchOptions,
): Promise<void> {
  const stop = io.stop;
  const stopped = new AbortController();
  const onStop = () => stopped.abort();
  stop?.addEventListener('abort', onStop, { once: true });
  // A terminal without a width (columns 0 or unknown: some CI pseudo-terminals, an editor's
  // output pane) would draw nothing: it gets the plain lines a pipe gets.
  const redraw =
    io.tty && !options.json && (io.tty.columns ?? 0) > 0
      ? createLogUpdate(io.tty, { showCursor: false })
      : undefined;
  const lastLines = new Map<string, string>();
  try {
    while (!stopped.signal.aborted) {
      const statuses = await readStatuses(trellis, options.target);
      const at = new Date();
      if (options.json) {
        io.out(`${JSON.stringify({ at, transforms: statuses })}\n`);
      } else if (redraw) {
        const header = `trellis status  ${trellis.instance}  ${at.toLocaleTimeString()}  (Ctrl-C to stop)\n`;
        const workers = await trellis.workers();
        redraw(`${header}${renderTable(statuses, { color: options.color, workers })}`);
      } else {
        for (const status of statuses) {
          const line = renderLine(status);
          if (lastLines.get(status.target) === line) continue;
          lastLines.set(status.target, line);
          io.out(`${at.toISOString()} ${line}\n`);
        }
      }
      if (options.until && reached(statuses, options.until)) break;
      await sleep(options.intervalMs, undefined, { signal: stopped.signal }).catch(() => undefined);
    }
  } finally {
    stop?.removeEventListener('abort', onStop);
    redraw?.done();
  }
}

function reached(statuses: readonly Status[], until: Lifecycle): boolean {
  return statuses.length > 0 && statuses.every((s) => s.status === until);
}
