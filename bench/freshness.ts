import { setTimeout as sleep } from 'node:timers/promises';
import postgres from 'postgres';
import { figure, type Scenario } from './scenario.js';
import { converge, percentile, trellisOn } from './support.js';

const RATE = 1_000;
const SECONDS = 10;
const WRITERS = 8;
const POLL_MS = 5;

/**
 * Commit → visible in the target at a steady write rate: WRITERS clients insert one row
 * per statement, paced to RATE a second in all, recording when each id's commit was
 * acknowledged; a reader polls every POLL_MS for ids it has not seen yet, recording when
 * each first appears in the target and, in the same query, in the source itself (the
 * baseline: what the measurement alone adds, about the polling interval).
 */
export const freshness: Scenario = {
  name: 'freshness',
  title: `Freshness: commit → visible at ${RATE.toLocaleString('en-US')} writes/s`,
  async run({ db, log }) {
    await db.sql.unsafe(`CREATE TABLE fresh_src (id int PRIMARY KEY, a int NOT NULL)`);
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    const total = RATE * SECONDS;
    const committed = new Float64Array(total + 1);
    const inTarget = new Float64Array(total + 1);
    const inSource = new Float64Array(total + 1);
    const clients = Array.from({ length: WRITERS + 1 }, () =>
      postgres(db.url, { max: 1, onnotice: () => undefined }),
    );
    const reader = clients[WRITERS]!;
    let writeSeconds = 0;
    try {
      await trellis.apply('TRANSFORM fresh_view FROM fresh_src SELECT a AS a');
      await converge(trellis, 'fresh_view');
      await Promise.all(clients.map((sql) => sql`SELECT 1`));

      let next = 1;
      let writing = true;
      const started = performance.now();
      const writers = clients.slice(0, WRITERS).map(async (sql) => {
        for (let id = next++; id <= total; id = next++) {
          const due = started + ((id - 1) * 1000) / RATE;
          const wait = due - performance.now();
          if (wait > 1) await sleep(wait);
          await sql`INSERT INTO fresh_src (id, a) VALUES (${id}, ${id % 1000})`;
          committed[id] = performance.now();
        }
      });
      const readerDone = (async () => {
        let lowTarget = 1;
        let lowSource = 1;
        const deadline = started + (SECONDS + 60) * 1000;
        while (lowTarget <= total && performance.now() < deadline) {
          const rows = await reader<{ t: boolean; id: number }[]>`
            SELECT true AS t, id FROM fresh_view WHERE id >= ${lowTarget}
            UNION ALL
            SELECT false, id FROM fresh_src WHERE id >= ${lowSource}`;
          const now = performance.now();
          for (const { t, id } of rows) {
            const seen = t ? inTarget : inSource;
            if (seen[id] === 0) seen[id] = now;
          }
          while (lowTarget <= total && inTarget[lowTarget] !== 0) lowTarget += 1;
          while (lowSource <= total && inSource[lowSource] !== 0) lowSource += 1;
          await sleep(writing ? POLL_MS : POLL_MS * 2);
        }
      })();
      await Promise.all(writers);
      writing = false;
      writeSeconds = (performance.now() - started) / 1000;
      await readerDone;
    } finally {
      await Promise.all(clients.map((sql) => sql.end({ timeout: 5 })));
      await trellis.shutdown();
    }

    const lags = (seen: Float64Array) => {
      const out: number[] = [];
      for (let id = 1; id <= total; id += 1) {
        if (seen[id] !== 0) out.push(Math.max(0, seen[id]! - committed[id]!));
      }
      return out.sort((a, b) => a - b);
    };
    const target = lags(inTarget);
    const source = lags(inSource);
    const rate = total / writeSeconds;
    log(
      `freshness: ${rate.toFixed(0)} writes/s; target p50 ${percentile(target, 50).toFixed(0)} ms, p99 ${percentile(target, 99).toFixed(0)} ms`,
    );
    const detail = {
      writesPerSecond: rate,
      writes: total,
      seenInTarget: target.length,
      maxMs: target.at(-1),
      pollMs: POLL_MS,
      writers: WRITERS,
    };
    return [50, 99].map((p) =>
      figure({
        scenario: 'freshness',
        figure: `commit → visible, p${p}`,
        value: target.length < total ? Number.POSITIVE_INFINITY : percentile(target, p),
        unit: 'ms',
        baseline: { label: 'visible in source', value: percentile(source, p) },
        ...(p === 99
          ? { target: { of: 'value', op: '<', threshold: 250, text: 'p99 < 250 ms' } }
          : {}),
        detail,
      }),
    );
  },
};
