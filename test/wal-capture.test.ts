import { describe, expect, it } from 'vitest';
import { waitUntilOnTheSlot } from './support/capture-mode.js';
import { sqlClient } from './support/database.js';
import { livePipeline } from './support/live.js';
import { type Definition, linkChains, transformStatement } from './support/oracle.js';
import { scrapeUntil } from './support/prometheus.js';
import { waitFor, waitForStatus } from './support/trellis.js';

// WAL capture (ADR 0023) end to end: a replication slot feeds the ledger, the sources carry
// no trigger, and every target equals its definition (the oracle) after every kind of
// change a trigger would have captured, chains included.

const live = livePipeline({
  capture: 'logical',
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), qty int);
      INSERT INTO items SELECT g, 'i' || g, g * 1.5, g % 7 FROM generate_series(1, 300) g;
      CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (b, a));
      INSERT INTO pairs SELECT g, 'k' || (g % 5), g FROM generate_series(1, 50) g;
      CREATE TABLE events (id bigint, day date, amount int, PRIMARY KEY (id, day))
        PARTITION BY RANGE (day);
      CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
      CREATE TABLE events_2 PARTITION OF events FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
      INSERT INTO events SELECT g, '2026-01-01'::date + (g % 50), g FROM generate_series(1, 100) g;`);
  },
});

// Chains (a FROM naming another's target) are recomputed from the base tables.
const D = linkChains({
  prices: {
    target: 'item_prices',
    from: 'items',
    select: 'name, price',
    where: 'price > 30',
    implicit: 'id',
  },
  stock: { target: 'item_stock', from: 'items', select: 'qty, count(*) AS n', groupBy: 'qty' },
  top: { target: 'item_top', from: 'item_prices', select: 'upper(name) AS shout', implicit: 'id' },
  pairs: { target: 'pair_sums', from: 'pairs', select: 'b, sum(v) AS total', groupBy: 'b' },
  events: {
    target: 'event_days',
    from: 'events',
    select: 'day, sum(amount) AS total',
    groupBy: 'day',
  },
} satisfies Record<string, Definition>);
const ALL = Object.values(D);

describe('WAL capture', () => {
  it('captures from the slot, with no trigger on the sources', { timeout: 300_000 }, async () => {
    await live.define(...ALL);
    // Making the slot waits for every transaction running in the cluster (another test
    // file's can hold it a while); the sources are on triggers meanwhile, as designed.
    await waitUntilOnTheSlot(live.db.sql);
    const sources = await live.db.sql<{ table: string; state: string | null; triggers: number }[]>`
      SELECT src.qualified AS table, src.wal_state AS state,
             (SELECT count(*)::int FROM pg_trigger t
               WHERE t.tgrelid = src.source_oid AND t.tgname LIKE 'trellis_capture%') AS triggers
        FROM trellis.sources src ORDER BY 1`;
    expect(sources.map((r) => [r.table, r.state, r.triggers])).toEqual([
      ['public.events', 'ready', 0],
      ['public.item_prices', 'ready', 0],
      ['public.items', 'ready', 0],
      ['public.pairs', 'ready', 0],
    ]);
    const [slot] = await live.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_replication_slots WHERE database = current_database()`;
    expect(slot?.n).toBe(1);
    await live.converged(ALL);

    // What an operator sees of it: status() and the metrics.
    const status = await live.trellis.status('item_prices');
    expect(status.capture.setting).toBe('logical');
    expect(status.capture.sources).toEqual([
      { table: 'public.items', mode: 'logical', reason: null, subscribed: false },
    ]);
    expect(status.capture.slot?.retainedBytes).toBeGreaterThanOrEqual(0);
    expect(status.capture.slot?.limitBytes).toBe(4 * 1024 ** 3);
    const instance = { trellis_instance: `${live.db.name}/trellis` };
    const metrics = await scrapeUntil(
      (s) => s.value('trellis_capture_sources', { ...instance, mode: 'logical' }) === 4,
      'four sources captured from the slot in the metrics',
    );
    expect(metrics.value('trellis_capture_sources', { ...instance, mode: 'trigger' })).toBe(0);
    expect(metrics.value('trellis_wal_retained_bytes', instance)).toBeGreaterThanOrEqual(0);
    expect(metrics.value('trellis_wal_retention_limit_bytes', instance)).toBe(4 * 1024 ** 3);
    // A schema dump's config row leaves the slot behind: the loaded database makes its own.
    const dump = await live.trellis.dumpDefinitionsSql();
    expect(dump).toContain('"capture":"logical"');
    expect(dump).not.toContain('wal_slot');
  });

  it('carries inserts, updates, deletes, key changes and TRUNCATE to every target', async () => {
    const sql = live.db.sql;
    await sql`INSERT INTO items SELECT g, 'n' || g, g, g % 3 FROM generate_series(301, 400) g`;
    await sql`UPDATE items SET price = price + 100 WHERE id % 10 = 0`;
    await sql`UPDATE items SET id = id + 1000 WHERE id BETWEEN 20 AND 25`;
    await sql`DELETE FROM items WHERE id BETWEEN 50 AND 60`;
    await sql`UPDATE pairs SET a = a + 100, b = 'z' WHERE a < 5`;
    await sql`DELETE FROM pairs WHERE a = 30`;
    await sql`INSERT INTO events VALUES (500, '2026-02-10', 7), (501, '2026-01-03', 9)`;
    await sql`UPDATE events SET day = '2026-02-20' WHERE id = 3`;
    await sql.begin(async (tx) => {
      await tx`UPDATE items SET qty = 99 WHERE id = 1`;
      await tx`INSERT INTO items VALUES (2000, 'tx', 1, 1)`;
    });
    await live.converged(ALL);
    await sql`TRUNCATE pairs`;
    await sql`INSERT INTO pairs VALUES (1, 'again', 5)`;
    await live.converged(ALL);
  });

  it('waits out a transaction older than the publication change, and names it in captureWait', async () => {
    await live.db.sql`CREATE TABLE late (id int PRIMARY KEY, v int NOT NULL)`;
    // A transaction with an xid, begun before the table is published: it could write the
    // table unpublished later (its first change came before the publication changed).
    const holder = sqlClient(live.db.url, { max: 1 });
    try {
      let commit: () => void = () => undefined;
      const committed = new Promise<void>((resolve) => {
        commit = resolve;
      });
      let pid = 0;
      const held = holder.begin(async (tx) => {
        const [row] = await tx<
          { pid: number }[]
        >`SELECT pg_backend_pid() AS pid, pg_current_xact_id()`;
        pid = row!.pid;
        await committed;
        await tx`INSERT INTO late VALUES (1, 10)`;
      });
      await waitFor(async () => pid !== 0, 'the older transaction to begin');
      const late: Definition = { target: 'late_values', from: 'late', select: 'v', implicit: 'id' };
      await live.trellis.apply(transformStatement(late));
      await waitFor(async () => {
        const wait = (await live.trellis.status('late_values')).captureWait;
        return wait?.operation === 'publish' && wait.blockers.some((b) => b.pid === pid);
      }, 'captureWait to name the older transaction');
      expect((await live.trellis.status('late_values')).status).toBe('waiting_to_backfill');
      commit();
      await held;
      await waitForStatus(live.trellis, 'late_values', 'live');
      await live.db.sql`UPDATE late SET v = 11`;
      await live.converged(late);
    } finally {
      await holder.end();
    }
  });

  it('reads its own writes: a token covers changes not yet decoded', async () => {
    // One write, then at once a token and a wait: the wait must not end before the slot
    // has delivered the write.
    for (let i = 0; i < 5; i += 1) {
      await live.db.sql`UPDATE items SET name = ${`rw${i}`} WHERE id = 100`;
      const token = await live.trellis.watermarkToken();
      await live.trellis.awaitConverged('item_prices', token, { timeoutMs: 20_000 });
      const [row] = await live.db.sql<
        { name: string }[]
      >`SELECT name FROM item_prices WHERE id = 100`;
      expect(row?.name).toBe(`rw${i}`);
    }
  });
});
