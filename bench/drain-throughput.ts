import { type BenchDb, converge, trellisOn } from './support.js';

export interface DrainResult {
  keys: number;
  ms: number;
  keysPerSecond: number;
}

/**
 * Drain throughput: a transform is paused while `keys` distinct source keys change, then
 * resumed; the time until it has applied them all, in keys per second.
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
  try {
    await trellis.apply('TRANSFORM drain_dst FROM drain_src SELECT a * 2 AS a2, b');
    await converge(trellis, 'drain_dst');
    await trellis.apply('PAUSE TRANSFORM drain_dst');
    await db.sql.unsafe(`UPDATE drain_src SET a = a + 1`);
    const started = performance.now();
    await trellis.apply('RESUME TRANSFORM drain_dst');
    await converge(trellis, 'drain_dst');
    const ms = performance.now() - started;
    return { keys, ms, keysPerSecond: keys / (ms / 1000) };
  } finally {
    await trellis.shutdown();
  }
}
