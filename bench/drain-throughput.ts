import { figure, type Scenario } from './scenario.js';
import { type BenchDb, checkpoint, converge, timed, trellisOn } from './support.js';

export interface DrainResult {
  keys: number;
  ms: number;
  keysPerSecond: number;
  /** The same rows rewritten by one `INSERT ... ON CONFLICT DO UPDATE` into a plain table. */
  upsertMs: number;
}

/**
 * Drain throughput: a transform is paused while `keys` distinct source keys change, then
 * resumed; the time until it has applied them all, in keys per second. The baseline is
 * one set-based upsert of the same new rows into an unmanaged copy of the target: the
 * write the drain cannot avoid, without the ledger, pages and workers around it.
 */
export async function drainThroughput(
  db: BenchDb,
  keys: number,
  drainThreads = 2,
): Promise<DrainResult> {
  await db.sql.unsafe(`
    CREATE TABLE drain_src (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
    INSERT INTO drain_src SELECT g, g % 1000, 'row ' || g FROM generate_series(1, ${keys}) g;
    ANALYZE drain_src;`);
  const trellis = await trellisOn(db.url, { staging: true, drainThreads });
  let ms: number;
  try {
    await trellis.apply('TRANSFORM drain_dst FROM drain_src SELECT a * 2 AS a2, b');
    await converge(trellis, 'drain_dst');
    await trellis.apply('PAUSE TRANSFORM drain_dst');
    await db.sql.unsafe(`UPDATE drain_src SET a = a + 1`);
    await checkpoint(db);
    const started = performance.now();
    await trellis.apply('RESUME TRANSFORM drain_dst');
    await converge(trellis, 'drain_dst');
    ms = performance.now() - started;
  } finally {
    await trellis.shutdown();
  }
  await db.sql.unsafe(`
    CREATE TABLE drain_copy (id int PRIMARY KEY, a2 int, b text);
    INSERT INTO drain_copy SELECT id, (a - 1) * 2, b FROM drain_src;
    ANALYZE drain_copy;`);
  await checkpoint(db);
  const upsertMs = await timed(() =>
    db.sql.unsafe(`
      INSERT INTO drain_copy AS t (id, a2, b) SELECT id, a * 2, b FROM drain_src
      ON CONFLICT (id) DO UPDATE SET a2 = EXCLUDED.a2, b = EXCLUDED.b
       WHERE t.a2 IS DISTINCT FROM EXCLUDED.a2 OR t.b IS DISTINCT FROM EXCLUDED.b`),
  );
  return { keys, ms, keysPerSecond: keys / (ms / 1000), upsertMs };
}

const KEYS = 200_000;

export const drain: Scenario = {
  name: 'drain',
  title: `Drain throughput: ${KEYS.toLocaleString('en-US')} keys changed while paused, then resumed`,
  async run({ db, log }) {
    const result = await drainThroughput(db, KEYS);
    log(`drain: ${result.keysPerSecond.toFixed(0)} keys/s (${result.ms.toFixed(0)} ms)`);
    return [
      figure({
        scenario: 'drain',
        figure: `re-derive ${KEYS.toLocaleString('en-US')} changed keys`,
        value: result.keysPerSecond,
        unit: 'keys/s',
        baseline: { label: 'one upsert statement', value: KEYS / (result.upsertMs / 1000) },
        target: { of: 'value', op: '>=', threshold: 50_000, text: '≥ 50,000 keys/s' },
        detail: { ms: result.ms, upsertMs: result.upsertMs, drainThreads: 2 },
      }),
    ];
  },
};
