import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { classifyError } from '../src/engine/db/classify.js';
import type { Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitForStatus } from './support/trellis.js';

// Issue #21 item 8: DROP TRANSFORM (and the other definitions) while the app writes to the
// source and the drain works on it. Before the fix, a DROP under four writers failed with
// 40P01 (deadlock detected) as an uncoded `database` error nearly every time.

let db: TestDatabase;
let trellis: Trellis;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE dw_src (id int PRIMARY KEY, v int NOT NULL, grp int NOT NULL);
    INSERT INTO dw_src SELECT i, i, i % 7 FROM generate_series(1, 2000) i;`);
  trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
});
afterAll(async () => {
  await trellis?.shutdown();
});

describe('definitions under concurrent writers', () => {
  it('define and DROP TRANSFORM repeatedly while four writers change the source: no deadlock reaches the caller', async () => {
    let stop = false;
    const writerErrors: unknown[] = [];
    let writes = 0;
    const writer = async (n: number) => {
      let i = 0;
      while (!stop) {
        i += 1;
        const lo = ((i * 37 + n * 500) % 1900) + 1;
        try {
          await db.sql.begin(async (tx) => {
            await tx.unsafe(`UPDATE dw_src SET v = v + 1 WHERE id BETWEEN ${lo} AND ${lo + 40}`);
            await tx.unsafe(`UPDATE dw_src SET grp = (grp + 1) % 7 WHERE id = ${lo + 50}`);
          });
          writes += 1;
        } catch (error) {
          // Writers deadlocking with each other (they update overlapping ranges) is the
          // app's own business; anything involving Trellis fails the test.
          if ((error as { code?: string }).code !== '40P01') writerErrors.push(error);
        }
      }
    };
    const writers = [0, 1, 2, 3].map(writer);
    const definitions: Definition[] = [
      { target: 'dw_rows', from: 'dw_src', select: 'v, grp', implicit: 'id' },
      { target: 'dw_groups', from: 'dw_src', select: 'grp, sum(v) AS total', groupBy: 'grp' },
    ];
    const failures: unknown[] = [];
    try {
      for (let round = 0; round < 6; round += 1) {
        for (const d of definitions) {
          try {
            await trellis.apply(transformStatement(d));
          } catch (error) {
            failures.push(error);
          }
        }
        for (const d of definitions) await waitForStatus(trellis, d.target, 'live', 60_000);
        if (round === 5) break;
        for (const d of definitions) {
          try {
            await trellis.apply(`DROP TRANSFORM ${d.target}`);
          } catch (error) {
            failures.push(error);
          }
        }
      }
    } finally {
      stop = true;
      await Promise.all(writers);
    }
    expect(failures).toEqual([]);
    expect(writerErrors).toEqual([]);
    expect(writes).toBeGreaterThan(0);
    const token = await trellis.watermarkToken();
    for (const d of definitions) {
      await trellis.awaitConverged(d.target, token, { timeoutMs: 30_000 });
      await expectMatchesDefinition(db.sql, d);
    }
  });
});

describe('a statement that keeps deadlocking', () => {
  it('fails with the coded `transient` error, never an uncoded database one', async () => {
    // A deadlock on each of 8 attempts cannot be arranged from outside (the other side
    // goes on once the statement's attempt gave way), so what reaches the caller is
    // checked on the code <schema>.apply() raises when its retries are exhausted.
    const error = classifyError(
      Object.assign(new Error('the statement met concurrent work 12 times in a row'), {
        code: 'TRT01',
      }),
    );
    expect(error).toMatchObject({ code: 'transient', sqlstate: 'TRT01' });
    const raw = classifyError(Object.assign(new Error('deadlock detected'), { code: '40P01' }));
    expect(raw.code).toBe('database'); // other calls: kept as they were
  });
});
