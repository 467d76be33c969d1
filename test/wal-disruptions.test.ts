import type postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { waitFor, waitForStatus } from './support/trellis.js';

// WAL capture changed outside Trellis, or past its ceiling (ADR 0023): the slot dropped, a
// source taken out of the publication, the slot holding more WAL than allowed. Each stops
// the readers with a reason (never silently wrong), and RESUME rebuilds them to equal their
// definition, writes made meanwhile included. And a table that cannot be captured from the
// WAL stays on triggers, saying why.

const live = livePipeline({
  capture: 'logical',
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL);
      INSERT INTO items SELECT g, 'i' || g, g % 9 FROM generate_series(1, 200) g;
      CREATE TABLE notes (id int PRIMARY KEY, body text);
      ALTER TABLE notes REPLICA IDENTITY NOTHING;
      INSERT INTO notes SELECT g, 'n' || g FROM generate_series(1, 20) g;`);
  },
});

const D = {
  items: { target: 'item_names', from: 'items', select: 'name, qty', implicit: 'id' },
  qty: { target: 'item_qty', from: 'items', select: 'qty, count(*) AS n', groupBy: 'qty' },
  notes: { target: 'note_bodies', from: 'notes', select: 'body', implicit: 'id' },
} satisfies Record<string, Definition>;

async function slotName(sql: postgres.Sql): Promise<string> {
  const [row] = await sql<{ slot: string | null }[]>`SELECT wal_slot AS slot FROM trellis.config`;
  if (!row?.slot) throw new Error('no slot recorded');
  return row.slot;
}

/** Drops the slot as an operator would: ending whatever streams it first. */
async function dropSlot(sql: postgres.Sql, slot: string): Promise<void> {
  await waitFor(async () => {
    const [row] = await sql<{ pid: number | null }[]>`
        SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = ${slot}`;
    if (!row) return true;
    if (row.pid !== null) {
      await sql`SELECT pg_terminate_backend(${row.pid})`;
      return false;
    }
    await sql`SELECT pg_drop_replication_slot(${slot})`.catch(() => undefined);
    return false;
  }, `slot ${slot} dropped`);
}

/**
 * Waits until items is captured from the slot alone. Making a slot waits for every
 * transaction running in the cluster (Postgres builds its snapshot so): another test
 * file's long or prepared transaction can hold it for a while, and meanwhile the sources
 * stay on triggers, as designed.
 */
async function onTheSlot(): Promise<void> {
  await waitFor(
    async () => (await live.trellis.status('item_names')).capture.sources[0]?.mode === 'logical',
    'items captured from the slot',
    180_000,
  );
}

async function stoppedBy(target: string, pattern: RegExp): Promise<void> {
  const status = await waitForStatus(live.trellis, target, 'paused', 60_000);
  expect(status.pauseReason).toBe('disruption');
  expect(status.captureFailure?.kind).toBe('disruption');
  expect(status.captureFailure?.error).toMatch(pattern);
}

async function resume(...targets: string[]): Promise<void> {
  for (const target of targets) await live.trellis.apply(`RESUME TRANSFORM ${target}`);
  for (const target of targets) await waitForStatus(live.trellis, target, 'live', 60_000);
}

describe('WAL capture disruptions and slot safety', { timeout: 300_000 }, () => {
  it('reports how each source is captured, and keeps one that cannot be on triggers', async () => {
    await live.define(D.items, D.qty, D.notes);
    await onTheSlot();
    const status = await live.trellis.status('item_names');
    expect(status.capture.setting).toBe('logical');
    expect(status.capture.sources).toEqual([
      { table: 'public.items', mode: 'logical', reason: null, subscribed: false },
    ]);
    expect(status.capture.slot?.name).toBe(await slotName(live.db.sql));
    expect(status.capture.slot?.limitBytes).toBe(4 * 1024 ** 3);
    expect(status.capture.slot?.retainedBytes).toBeGreaterThanOrEqual(0);
    const notes = await live.trellis.status('note_bodies');
    expect(notes.capture.sources).toEqual([
      {
        table: 'public.notes',
        mode: 'trigger',
        reason: 'public.notes has REPLICA IDENTITY NOTHING',
        subscribed: false,
      },
    ]);
    await live.db.sql`UPDATE notes SET body = 'changed' WHERE id < 5`;
    await live.converged(Object.values(D));
    // Made capturable, it moves to the slot; made uncapturable again, back to triggers.
    await live.db.sql`ALTER TABLE notes REPLICA IDENTITY FULL`;
    await waitFor(
      async () => (await live.trellis.status('note_bodies')).capture.sources[0]?.mode === 'logical',
      'notes on WAL capture',
    );
    await live.db.sql`DELETE FROM notes WHERE id = 3`;
    await live.converged(D.notes);
    await live.db.sql`ALTER TABLE notes REPLICA IDENTITY NOTHING`;
    await waitFor(
      async () => (await live.trellis.status('note_bodies')).capture.sources[0]?.mode === 'trigger',
      'notes back on triggers',
    );
    await live.db.sql`INSERT INTO notes VALUES (100, 'new')`;
    await live.converged(D.notes);
  });

  it('a slot dropped outside Trellis stops its readers; a new slot, and RESUME rebuilds', async () => {
    await onTheSlot();
    const slot = await slotName(live.db.sql);
    await dropSlot(live.db.sql, slot);
    await live.db.sql`UPDATE items SET qty = qty + 100 WHERE id <= 50`;
    await stoppedBy(
      'item_names',
      /replication slot .* does not exist on this server \(a promoted standby or a restored backup\?\), or was dropped outside Trellis/,
    );
    await stoppedBy(
      'item_qty',
      /replication slot .* does not exist on this server \(a promoted standby or a restored backup\?\), or was dropped outside Trellis/,
    );
    // A source on triggers lost nothing.
    expect((await live.trellis.status('note_bodies')).status).toBe('live');
    await resume('item_names', 'item_qty');
    await live.converged([D.items, D.qty]);
  });

  it('a source taken out of the publication stops its readers until RESUME', async () => {
    await onTheSlot();
    const [pub] = await live.db.sql<{ name: string }[]>`SELECT trellis._wal_publication() AS name`;
    await live.db.sql.unsafe(`ALTER PUBLICATION ${pub!.name} DROP TABLE items`);
    await live.db.sql`DELETE FROM items WHERE id BETWEEN 60 AND 70`;
    await live.trellis.detectCaptureDisruptions();
    await stoppedBy('item_names', /public\.items was taken out of the publication/);
    await resume('item_names', 'item_qty');
    await live.converged([D.items, D.qty]);
  });

  it('a slot past its ceiling is dropped and its readers stopped, never left to fill the disk', async () => {
    await onTheSlot();
    await live.db.sql`SELECT trellis.set_capture('logical', 16384)`;
    // WAL beyond the ceiling before the slot can move on (its restart point follows
    // running-transaction records, seconds apart).
    await live.db.sql`UPDATE items SET name = name || '+' WHERE id > 0`;
    await stoppedBy('item_names', /held \d+ bytes of WAL, over the ceiling of 16384/);
    await live.db.sql`SELECT trellis.set_capture('logical', 4294967296)`;
    await live.db.sql`UPDATE items SET qty = 0 WHERE id = 150`;
    await resume('item_names', 'item_qty');
    await live.converged([D.items, D.qty]);
    const status = await live.trellis.status('item_names');
    expect(status.capture.slot?.limitBytes).toBe(4294967296);
  });
});
