import { setTimeout as sleep } from 'node:timers/promises';
import postgres from 'postgres';

/** How a freshness measurement writes, and how it sees a write in the target and source. */
export interface FreshnessProbe {
  /** Write number `i` (1-based): one statement, committed on its own. */
  write(sql: postgres.Sql, i: number): Promise<unknown>;
  /**
   * In one snapshot (one statement): the writes numbered from `lowTarget` up to `issued`
   * that are visible in the target, and those from `lowSource` visible in the source.
   * Writes seen before may be listed again.
   */
  poll(
    sql: postgres.Sql,
    range: { lowTarget: number; lowSource: number; issued: number },
  ): Promise<{ target: number[]; source: number[] }>;
}

export interface FreshnessOptions {
  /** Writes per second, all writers together. */
  rate: number;
  seconds: number;
  writers: number;
  /** The reader's pause between polls (twice as long once writing is done). */
  pollMs: number;
}

export interface FreshnessResult {
  /** Commit → first seen in the target, ms, ascending; fewer than `writes` if some never showed. */
  target: number[];
  /** Commit → first seen in the source: what the polling itself adds. */
  source: number[];
  writes: number;
  writesPerSecond: number;
}

/**
 * Commit → visible at a steady write rate: `writers` clients, paced to `rate` writes a
 * second in all, record when each write's commit was acknowledged; a reader polls every
 * `pollMs` for writes it has not seen yet, recording when each first appears in the target
 * and, in the same statement, in the source (the baseline: about the polling interval).
 * Gives up on the target 60 s after the writes were due.
 */
export async function measureFreshness(
  url: string,
  probe: FreshnessProbe,
  o: FreshnessOptions,
): Promise<FreshnessResult> {
  const total = o.rate * o.seconds;
  const committed = new Float64Array(total + 1);
  const inTarget = new Float64Array(total + 1);
  const inSource = new Float64Array(total + 1);
  const clients = Array.from({ length: o.writers + 1 }, () =>
    postgres(url, { max: 1, onnotice: () => undefined }),
  );
  const reader = clients[o.writers]!;
  let writeSeconds = 0;
  try {
    await Promise.all(clients.map((sql) => sql`SELECT 1`));
    let next = 1;
    let writing = true;
    const started = performance.now();
    const writers = clients.slice(0, o.writers).map(async (sql) => {
      for (let i = next++; i <= total; i = next++) {
        const due = started + ((i - 1) * 1000) / o.rate;
        const wait = due - performance.now();
        if (wait > 1) await sleep(wait);
        await probe.write(sql, i);
        committed[i] = performance.now();
      }
    });
    const readerDone = (async () => {
      let lowTarget = 1;
      let lowSource = 1;
      const deadline = started + (o.seconds + 60) * 1000;
      while (lowTarget <= total && performance.now() < deadline) {
        const seen = await probe.poll(reader, {
          lowTarget,
          lowSource,
          issued: Math.min(total, next - 1),
        });
        const now = performance.now();
        for (const i of seen.target) if (inTarget[i] === 0) inTarget[i] = now;
        for (const i of seen.source) if (inSource[i] === 0) inSource[i] = now;
        while (lowTarget <= total && inTarget[lowTarget] !== 0) lowTarget += 1;
        while (lowSource <= total && inSource[lowSource] !== 0) lowSource += 1;
        await sleep(writing ? o.pollMs : o.pollMs * 2);
      }
    })();
    await Promise.all(writers);
    writing = false;
    writeSeconds = (performance.now() - started) / 1000;
    await readerDone;
  } finally {
    await Promise.all(clients.map((sql) => sql.end({ timeout: 5 })));
  }
  const lags = (seen: Float64Array) => {
    const out: number[] = [];
    for (let i = 1; i <= total; i += 1) {
      if (seen[i] !== 0) out.push(Math.max(0, seen[i]! - committed[i]!));
    }
    return out.sort((a, b) => a - b);
  };
  return {
    target: lags(inTarget),
    source: lags(inSource),
    writes: total,
    writesPerSecond: total / writeSeconds,
  };
}
