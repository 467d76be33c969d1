import type { Logger } from '../../src/engine/index.js';
import { quietLogger } from './recent-logs.js';

/**
 * The drain's records of its work (debug lines, src/engine/drain/): a build chunk filled,
 * a page applied, a small range applied at once (ranges.ts), each with when it ran by the server's clock (`fromMs`, `toMs`) and the
 * backend that ran it. Tests prove that work ran side by side from these, not by sampling
 * pg_stat_activity (which misses what runs between two looks).
 */
export const WORK_EVENTS = ['a build chunk filled', 'a page applied', 'a range applied'] as const;

export interface WorkEvent {
  msg: (typeof WORK_EVENTS)[number];
  target: string;
  backend: number;
  fromMs: number;
  toMs: number;
  /** Which process logged it (`test` for the test's own handles). */
  process: string;
}

/** A logger keeping the work events in `events` (and the rest as quietLogger does). */
export function workEventLogger(events: WorkEvent[], process = 'test'): Logger {
  return {
    ...quietLogger,
    debug(obj: Record<string, unknown>, msg: string) {
      if ((WORK_EVENTS as readonly string[]).includes(msg)) {
        events.push({ ...(obj as Omit<WorkEvent, 'msg' | 'process'>), msg, process } as WorkEvent);
      }
    },
  };
}

/** Parses the `event {json}` lines a worker process prints (test/fixtures/worker-process.ts). */
export function collectPrintedEvents(events: WorkEvent[], process: string) {
  let pending = '';
  return (chunk: string) => {
    pending += chunk;
    const lines = pending.split('\n');
    pending = lines.pop() ?? '';
    for (const line of lines) {
      if (line.startsWith('event ')) events.push({ ...JSON.parse(line.slice(6)), process });
    }
  };
}

/** The most of `events` whose times overlap at one moment. */
export function mostAtOnce(events: readonly WorkEvent[]): number {
  const edges = events.flatMap((e) => [
    { at: e.fromMs, step: 1 },
    { at: e.toMs, step: -1 },
  ]);
  // An end before a start at the same instant: touching is not overlapping.
  edges.sort((a, b) => a.at - b.at || a.step - b.step);
  let now = 0;
  let most = 0;
  for (const edge of edges) {
    now += edge.step;
    most = Math.max(most, now);
  }
  return most;
}
