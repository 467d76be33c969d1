import { describe, expect, it } from 'vitest';
import { waitUntilOnTheSlot } from './support/capture-mode.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { rejection, waitFor } from './support/trellis.js';

// Issue #21 item 9: what Postgres itself refuses on a table Trellis captures from the WAL
// (it is in Trellis's publication). REPLICA IDENTITY NOTHING makes every UPDATE and DELETE
// of it fail (55000) until the staging worker takes it out of the publication and back onto
// triggers; SET UNLOGGED is refused outright. README ("WAL capture") and ADR 0008 say so.

const live = livePipeline({
  capture: 'logical',
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE we_items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL);
      INSERT INTO we_items SELECT g, 'i' || g, g % 7 FROM generate_series(1, 200) g;`);
  },
});

const D: Definition = { target: 'we_names', from: 'we_items', select: 'name, qty', implicit: 'id' };

async function mode(): Promise<string | undefined> {
  return (await live.trellis.status(D.target)).capture.sources[0]?.mode;
}

describe('WAL capture edges', () => {
  it('REPLICA IDENTITY NOTHING: UPDATEs fail only until the table is back on triggers, and nothing is lost', async () => {
    await live.define(D);
    await waitUntilOnTheSlot(live.db.sql);
    await waitFor(async () => (await mode()) === 'logical', 'we_items on WAL capture');

    const altered = Date.now();
    await live.db.sql`ALTER TABLE we_items REPLICA IDENTITY NOTHING`;
    // What the app sees: its UPDATEs fail with 55000 until the staging worker moved the
    // table (each failed statement changed nothing).
    let failures = 0;
    for (;;) {
      try {
        await live.db.sql`UPDATE we_items SET qty = qty + 1 WHERE id <= 20`;
        break;
      } catch (error) {
        expect((error as { code?: string }).code).toBe('55000');
        failures += 1;
        // The app's retry interval: this loop waits for its UPDATE to go through.
        await new Promise((resolve) => setTimeout(resolve, 20)); // the app's retry interval
      }
      if (Date.now() - altered > 30_000) throw new Error('UPDATEs still failing after 30 s');
    }
    const window = Date.now() - altered;
    console.log(`[wal-capture-edges] UPDATEs failed for ${window} ms (${failures} attempts)`);
    // Under a second on an idle machine (the staging worker sees the change within its
    // next look at the catalog, 50-200 ms); loosely bounded here for a loaded one.
    expect(window).toBeLessThan(10_000);
    expect(await mode()).toBe('trigger');
    expect((await live.trellis.status(D.target)).capture.sources[0]?.reason).toBe(
      'public.we_items has REPLICA IDENTITY NOTHING',
    );
    await live.db.sql`DELETE FROM we_items WHERE id BETWEEN 30 AND 40`;
    await live.converged(D);
    expect((await live.trellis.status(D.target)).status).toBe('live');
  });

  it('SET UNLOGGED is refused by Postgres while the table is published; the transform stays live', async () => {
    await live.db.sql`ALTER TABLE we_items REPLICA IDENTITY DEFAULT`;
    await waitFor(async () => (await mode()) === 'logical', 'we_items on WAL capture again');
    const error = await rejection(live.db.sql`ALTER TABLE we_items SET UNLOGGED`);
    expect(error.message).toMatch(/publication/);
    await live.db.sql`UPDATE we_items SET name = name || '!' WHERE id % 5 = 0`;
    await live.converged(D);
    expect((await live.trellis.status(D.target)).status).toBe('live');
  });
});
