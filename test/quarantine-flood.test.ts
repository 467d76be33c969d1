import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type LoggedLine, recordingLogger } from './support/logging.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor } from './support/trellis.js';

// Issue #21 item 12: floods of failing rows. 400 failing rows in a drain and 800 of 2,400
// in a backfill were bisected key by key, one warning line each, and the address paused
// at quarantineThreshold (100) only once every key had been tried; the backfill showed 0%
// and no held keys meanwhile. Now each held key counts toward the threshold as it is
// found, the bisection stops (or goes on without the paused column) there, the build
// shows the keys it holds, and the log says the first few and sums up the rest.

const THRESHOLD = 100;
let db: TestDatabase;
let trellis: Trellis;
const lines: LoggedLine[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE qf_drained (id int PRIMARY KEY, v int NOT NULL, d int NOT NULL);
    INSERT INTO qf_drained SELECT i, i, 1 FROM generate_series(1, 100) i;
    -- 800 of 2,400 rows divide by zero.
    CREATE TABLE qf_built (id int PRIMARY KEY, v int NOT NULL, d int NOT NULL);
    INSERT INTO qf_built SELECT i, i, CASE WHEN i % 3 = 0 THEN 0 ELSE 1 END FROM generate_series(1, 2400) i;`);
  trellis = await migratedTrellis(db, {
    staging: true,
    drainThreads: 1,
    logger: recordingLogger(lines),
  });
});
afterAll(async () => {
  await trellis?.shutdown();
});

function heldLines(target: string): LoggedLine[] {
  return lines.filter(
    (l) => l.level === 'warn' && l.obj.target === target && l.msg.startsWith('key held at'),
  );
}
function summaries(target: string): LoggedLine[] {
  return lines.filter(
    (l) => l.level === 'warn' && l.obj.target === target && / keys held in one pass /.test(l.msg),
  );
}

describe('floods of failing rows', () => {
  it('400 failing rows in a drain: the column pauses at the threshold, the rest of the rows flow without it, and the log sums up', async () => {
    const d: Definition = {
      target: 'qf_ratio',
      from: 'qf_drained',
      select: 'v / d AS ratio, v AS plain',
      implicit: 'id',
    };
    await trellis.apply(transformStatement(d));
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 30_000 });
    // 400 rows that divide by zero, among 200 that do not, in one statement.
    await db.sql.unsafe(`
      INSERT INTO qf_drained
      SELECT i, i, CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END FROM generate_series(1001, 1600) i;`);
    await waitFor(
      async () => (await trellis.status(d.target)).pausedColumns.includes('qf_ratio.ratio'),
      'qf_ratio.ratio to pause',
      60_000,
    );
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 30_000 });
    const held = (await trellis.quarantined()).find((e) => e.address === 'qf_ratio.ratio');
    // Paused at the threshold: the other 300 keys were not each tried and held.
    expect(held?.count).toBe(THRESHOLD);
    expect(held?.paused).toBe(true);
    // Every row is there, with its other columns current (the paused column keeps NULL
    // for a new row, or its last value).
    const [counts] = await db.sql<{ rows: number; wrong: number; ratios: number }[]>`
      SELECT count(*)::int AS rows,
             count(*) FILTER (WHERE t.plain IS DISTINCT FROM s.v)::int AS wrong,
             count(t.ratio)::int AS ratios
        FROM qf_drained s LEFT JOIN qf_ratio t ON t.id = s.id`;
    expect(counts).toMatchObject({ rows: 700, wrong: 0 });
    // One line per key for the first ten, then one line with the counts.
    expect(heldLines(d.target).length).toBeLessThanOrEqual(10);
    const [summary] = summaries(d.target);
    expect(summary?.obj).toMatchObject({ held: THRESHOLD, paused: ['qf_ratio.ratio'] });
    expect(summary?.msg).toContain('100 at qf_ratio.ratio');
    // Fixed and resumed, the column is rebuilt and the target equals its definition.
    await db.sql.unsafe('UPDATE qf_drained SET d = 1 WHERE d = 0');
    await trellis.apply('RESUME TRANSFORM qf_ratio.ratio');
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 60_000 });
    await expectMatchesDefinition(db.sql, d);
  });

  it('800 failing rows of 2,400 in a backfill: held keys show as they are found, and the transform pauses at the threshold', async () => {
    const d: Definition = {
      target: 'qf_filtered',
      from: 'qf_built',
      select: 'v AS plain',
      where: 'v / d >= 0',
      implicit: 'id',
    };
    await trellis.apply(transformStatement(d));
    await waitFor(
      async () => (await trellis.status(d.target)).status === 'paused',
      'qf_filtered to pause',
      60_000,
    );
    const status = await trellis.status(d.target);
    expect(status.pauseReason).toBe('quarantine');
    expect(status.heldKeys).toBe(THRESHOLD);
    // The build's progress counts the keys it went through, held ones included, and says
    // how many it holds.
    expect(status.backfill?.keysHeld).toBe(THRESHOLD);
    expect(status.backfill?.keysDone).toBeGreaterThan(0);
    expect(status.backfill?.keysTotal).toBe(2400);
    expect(heldLines(d.target).length).toBeLessThanOrEqual(20);
    expect(summaries(d.target).length).toBeGreaterThan(0);
    expect(summaries(d.target).at(-1)?.obj).toMatchObject({ paused: ['qf_filtered'] });
    // Fixed and resumed, the build completes and the target equals its definition.
    await db.sql.unsafe('UPDATE qf_built SET d = 1 WHERE d = 0');
    await trellis.apply('RESUME TRANSFORM qf_filtered');
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 60_000 });
    await expectMatchesDefinition(db.sql, d);
  });
});
