import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { differences } from './support/oracle.js';
import { migratedTrellis, waitForStatus } from './support/trellis.js';

let db: TestDatabase;
let trellis: Trellis;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), qty int);
    INSERT INTO widgets SELECT g, 'w' || g, g * 1.5, g % 7 FROM generate_series(1, 500) g;
  `);
  trellis = await migratedTrellis(db, { staging: false });
});

afterAll(async () => {
  await trellis?.shutdown();
});

async function converge(target: string, t: Trellis = trellis) {
  const token = await t.watermarkToken();
  await t.awaitConverged(target, token, { timeoutMs: 20_000 });
  expect(await differences(db.sql, target)).toEqual({ missing: [], extra: [] });
}

describe('the live pipeline', () => {
  it('backfills a projection, goes live, and follows inserts, updates and deletes', async () => {
    await using worker = await migratedTrellis(db, { staging: true, drainThreads: 2 });
    await trellis.apply('TRANSFORM widget_prices FROM widgets SELECT name, price WHERE price > 10');
    await converge('widget_prices', worker);
    await waitForStatus(trellis, 'widget_prices', 'live');

    expect(await worker.hasLiveStagingWorker()).toBe(true);
    expect(await worker.hasLiveDrainWorkers()).toBe(true);

    await db.sql.unsafe(`
      INSERT INTO widgets VALUES (1001, 'new', 99, 1), (1002, 'cheap', 1, 1);
      UPDATE widgets SET price = 5 WHERE id = 20;        -- leaves the filter
      UPDATE widgets SET price = 50 WHERE id = 3;        -- enters it
      UPDATE widgets SET name = 'renamed' WHERE id = 30; -- stays, changes
      DELETE FROM widgets WHERE id BETWEEN 40 AND 45;
      UPDATE widgets SET id = 5000 WHERE id = 50;        -- key change
    `);
    await converge('widget_prices', worker);
  });
});
