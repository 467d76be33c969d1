import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { TEST_CAPTURE } from './support/capture-mode.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import {
  type Definition,
  expectMatchesDefinition,
  linkChains,
  transformStatement,
} from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

let db: TestDatabase;
/** A handle for calls only, as an app's web process would have. */
let trellis: Trellis;
/** The fleet's worker: staging and two drain loops. */
let worker: Trellis;

beforeAll(async () => {
  db = await freshDatabase();
  await db.sql.unsafe(`
    CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), qty int);
    INSERT INTO widgets SELECT g, 'w' || g, g * 1.5, g % 7 FROM generate_series(1, 500) g;
  `);
  trellis = await migratedTrellis(db);
  worker = await migratedTrellis(db, { staging: true, drainThreads: 2 });
});

afterAll(async () => {
  await worker?.shutdown();
  await trellis?.shutdown();
});

/**
 * Whether `table` is captured the suite's way: its four capture triggers, or (WAL
 * capture) published, itself or through the partitioned table it belongs to.
 */
async function captured(table: string): Promise<boolean> {
  if (TEST_CAPTURE === 'logical') {
    const [row] = await db.sql<{ published: boolean }[]>`
      SELECT EXISTS (SELECT 1 FROM pg_publication_tables
                      WHERE pubname = trellis._wal_publication() AND tablename = ${table}) AS published`;
    return row?.published === true;
  }
  const [row] = await db.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_trigger WHERE tgrelid = ${table}::regclass AND NOT tgisinternal`;
  return row?.n === 4;
}

/** The transforms this file defines, each as its statement means it. */
// Chains (a FROM naming another's target) are recomputed from the base tables.
const D = linkChains({
  widget_prices: {
    target: 'widget_prices',
    from: 'widgets',
    select: 'name, price',
    where: 'price > 10',
    implicit: 'id',
  },
  widget_stock: { target: 'widget_stock', from: 'widgets', select: 'name, qty', implicit: 'id' },
  chain_base: {
    target: 'chain_base',
    from: 'widgets',
    select: 'name, price',
    where: 'qty > 2',
    implicit: 'id',
  },
  chain_top: {
    target: 'chain_top',
    from: 'chain_base',
    select: 'upper(name) AS shout, price * 2 AS doubled',
    where: "name <> 'w7'",
    implicit: 'id',
  },
  big_lines: {
    target: 'big_lines',
    from: 'ledger_lines',
    select: 'amount',
    where: 'amount >= 500',
    implicit: 'id',
  },
  big_lines_top: {
    target: 'big_lines_top',
    from: 'big_lines',
    select: 'amount',
    where: 'amount >= 900',
    implicit: 'id',
  },
  mid_build: { target: 'mid_build', from: 'ledger_lines', select: 'amount', implicit: 'id' },
  mid_build_top: {
    target: 'mid_build_top',
    from: 'mid_build',
    select: 'amount',
    where: 'amount < 10',
    implicit: 'id',
  },
  gadget_labels: { target: 'gadget_labels', from: 'gadgets', select: 'label', implicit: 'id' },
  gadget_shout: {
    target: 'gadget_shout',
    from: 'gadget_labels',
    select: 'upper(label) AS label',
    implicit: 'id',
  },
  paused_prices: { target: 'paused_prices', from: 'widgets', select: 'price', implicit: 'id' },
  ratio_values: {
    target: 'ratio_values',
    from: 'ratios',
    select: 'a / b AS ratio',
    implicit: 'id',
  },
  doubled_measurements: {
    target: 'doubled_measurements',
    from: 'measurements',
    select: 'value * 2 AS doubled',
    // The source's key is (id, site).
    implicit: 'id, site',
  },
} satisfies Record<string, Definition>);

/** Waits for the target to take in every write so far, then compares it with its definition. */
async function converge(d: Definition) {
  const token = await trellis.watermarkToken();
  await trellis.awaitConverged(d.target, token, { timeoutMs: 20_000 });
  await expectMatchesDefinition(db.sql, d);
}

/**
 * Defines each transform that is not defined yet, and waits until it is live: a test that
 * needs one defines it itself, whatever ran before it (or did not).
 */
async function ensureDefined(...defs: Definition[]): Promise<void> {
  const defined = new Set((await trellis.definitions()).map((d) => d.target));
  for (const d of defs) {
    if (defined.has(d.target)) continue;
    await trellis.apply(transformStatement(d));
    await waitForStatus(trellis, d.target, 'live');
  }
}

/** Changed keys the ledger holds for `table` (a ledger row holds a statement's keys). */
async function ledgerKeys(table: string): Promise<number> {
  const [row] = await db.sql`
    SELECT coalesce(sum(cardinality(l.keys)), 0)::int AS n FROM trellis.ledger l
      JOIN trellis.sources s ON s.id = l.source_id WHERE s.source_oid = ${table}::regclass`;
  return row!.n as number;
}

/** Primary keys the table has (none while a build has deferred its key). */
async function primaryKeys(table: string): Promise<number> {
  const [row] = await db.sql`
    SELECT count(*)::int AS n FROM pg_index WHERE indrelid = ${table}::regclass AND indisprimary`;
  return row!.n as number;
}

/**
 * Waits for the first backfill chunk of `target`, then pauses it between chunks (holding
 * its pipeline row while pausing, so no chunk runs in between).
 */
async function holdBuild(target: string, rows: number): Promise<void> {
  // Paused while at most half the source's `rows` are built, reading the progress and
  // pausing in one transaction: chunks already being filled finish, the rest wait (a fast
  // machine could finish the build between a status() read and a later pause).
  await waitFor(
    () =>
      db.sql.begin(async (tx) => {
        const [row] = await tx<{ s: { status: string; backfill: { keysDone: number } | null } }[]>`
          SELECT trellis.status(${target}) AS s`;
        const done = Number(row?.s.backfill?.keysDone ?? 0);
        if (row?.s.status !== 'backfilling' || done === 0 || done > rows / 2) return false;
        await tx`SELECT trellis.apply(${`PAUSE TRANSFORM ${target}`})`;
        return true;
      }),
    `${target}'s build with a chunk done and half its rows left`,
  );
}

describe('the live pipeline', () => {
  it('backfills a projection, goes live, and follows inserts, updates and deletes', async () => {
    await trellis.apply(transformStatement(D.widget_prices));
    await converge(D.widget_prices);
    const live = await waitForStatus(trellis, 'widget_prices', 'live');
    expect(live.backfill).toMatchObject({ keysDone: 500, keysTotal: 500 });
    expect(await trellis.hasLiveStagingWorker()).toBe(true);
    expect(await trellis.hasLiveDrainWorkers()).toBe(true);

    await db.sql.unsafe(`
      INSERT INTO widgets VALUES (1001, 'new', 99, 1), (1002, 'cheap', 1, 1);
      UPDATE widgets SET price = 5 WHERE id = 20;        -- leaves the filter
      UPDATE widgets SET price = 50 WHERE id = 3;        -- enters it
      UPDATE widgets SET name = 'renamed' WHERE id = 30; -- stays, changes
      DELETE FROM widgets WHERE id BETWEEN 40 AND 45;
      UPDATE widgets SET id = 5000 WHERE id = 50;        -- key change
    `);
    await converge(D.widget_prices);
  });

  // Trigger capture compares the columns transforms read; WAL capture takes every UPDATE
  // (ADR 0023: pgoutput sends no old row to compare with).
  it.skipIf(TEST_CAPTURE === 'logical')(
    'captures nothing for an UPDATE that changes no column a transform reads',
    async () => {
      await db.sql.unsafe(`
      CREATE TABLE quiet_items (id int PRIMARY KEY, price numeric NOT NULL, qty int NOT NULL);
      INSERT INTO quiet_items SELECT g, g, g FROM generate_series(1, 200) g;`);
      const quiet: Definition = {
        target: 'quiet_prices',
        from: 'quiet_items',
        select: 'price',
        implicit: 'id',
      };
      await ensureDefined(quiet);
      const before = await ledgerKeys('quiet_items');
      await db.sql`UPDATE quiet_items SET qty = qty + 1 WHERE id < 100`;
      expect(await ledgerKeys('quiet_items')).toBe(before);
      await db.sql`UPDATE quiet_items SET price = price + 1 WHERE id < 10`;
      expect(await ledgerKeys('quiet_items')).toBe(before + 9);
      await converge(quiet);
    },
  );

  it('widens capture when a new transform reads more columns', async () => {
    await db.sql.unsafe(`
      CREATE TABLE wide_items (id int PRIMARY KEY, price numeric NOT NULL, qty int NOT NULL);
      INSERT INTO wide_items SELECT g, g, g FROM generate_series(1, 200) g;`);
    const prices: Definition = {
      target: 'wide_prices',
      from: 'wide_items',
      select: 'price',
      implicit: 'id',
    };
    const stock: Definition = {
      target: 'wide_stock',
      from: 'wide_items',
      select: 'qty',
      implicit: 'id',
    };
    await ensureDefined(prices);
    // qty is not captured yet; the second transform widens capture to it. (WAL capture
    // takes every column from the start: only the targets are checked then.)
    await db.sql`UPDATE wide_items SET qty = qty + 1 WHERE id <= 10`;
    if (TEST_CAPTURE === 'trigger') expect(await ledgerKeys('wide_items')).toBe(0);
    await ensureDefined(stock);
    await db.sql`UPDATE wide_items SET qty = qty * 10 WHERE id BETWEEN 100 AND 120`;
    if (TEST_CAPTURE === 'trigger') {
      expect(await ledgerKeys('wide_items')).toBeGreaterThanOrEqual(21);
    }
    await converge(stock);
    await converge(prices);
  });

  it('keeps a chain (a transform over another’s target) in step', async () => {
    await trellis.apply(transformStatement(D.chain_base));
    await trellis.apply(transformStatement(D.chain_top));
    await converge(D.chain_top);
    await db.sql.unsafe(`
      UPDATE widgets SET qty = 0 WHERE id BETWEEN 200 AND 220;
      UPDATE widgets SET name = name || '!' WHERE id BETWEEN 300 AND 320;
      INSERT INTO widgets SELECT g, 'fresh' || g, g, 5 FROM generate_series(2000, 2050) g;
    `);
    await converge(D.chain_top);
    await converge(D.chain_base);
  });

  it('builds a chain and its upstream together over a table of several backfill chunks', async () => {
    await db.sql.unsafe(`
      CREATE TABLE ledger_lines (id int PRIMARY KEY, amount int NOT NULL);
      INSERT INTO ledger_lines SELECT g, g % 1000 FROM generate_series(1, 250000) g;
    `);
    // Defined in one migration: the upstream's build runs while the chain drains what it
    // writes, looking its rows up by key all along.
    await db.sql.begin(async (tx) => {
      await tx`SELECT trellis.apply(${transformStatement(D.big_lines)})`;
      await tx`SELECT trellis.apply(${transformStatement(D.big_lines_top)})`;
    });
    // Caught between chunks, the upstream's build still has its key.
    await holdBuild('big_lines', 250_000);
    expect((await trellis.status('big_lines')).backfill?.keysDone).toBeLessThan(250_000);
    expect(await primaryKeys('big_lines')).toBe(1);
    await trellis.apply('RESUME TRANSFORM big_lines');
    await db.sql`UPDATE ledger_lines SET amount = 950 WHERE id % 1000 = 1`;
    await converge(D.big_lines);
    await converge(D.big_lines_top);
  });

  it('gives a target its key back mid-build when a transform is defined over it', async () => {
    await trellis.apply(transformStatement(D.mid_build));
    await holdBuild('mid_build', 250_000);
    expect((await trellis.status('mid_build')).backfill?.keysDone).toBeLessThan(250_000);
    expect(await primaryKeys('mid_build')).toBe(0); // deferred to the end of the build
    await trellis.apply(transformStatement(D.mid_build_top));
    expect(await primaryKeys('mid_build')).toBe(1);
    await trellis.apply('RESUME TRANSFORM mid_build');
    await converge(D.mid_build);
    await converge(D.mid_build_top);
  });

  it('flows a TRUNCATE of a source through, down the chain', async () => {
    await db.sql.unsafe(`
      CREATE TABLE gadgets (id int PRIMARY KEY, label text);
      INSERT INTO gadgets SELECT g, 'g' || g FROM generate_series(1, 100) g;
    `);
    await trellis.apply(transformStatement(D.gadget_labels));
    await trellis.apply(transformStatement(D.gadget_shout));
    await converge(D.gadget_shout);
    await db.sql.begin(async (tx) => {
      await tx`TRUNCATE gadgets`;
      await tx`INSERT INTO gadgets VALUES (7, 'after')`;
    });
    await converge(D.gadget_labels);
    await converge(D.gadget_shout);
    const rows = await db.sql`SELECT label FROM gadget_shout`;
    expect(rows.map((r) => r.label)).toEqual(['AFTER']);
  });

  it('holds a paused transform still while others flow, and catches it up on RESUME', async () => {
    await ensureDefined(D.widget_prices);
    await trellis.apply(transformStatement(D.paused_prices));
    await converge(D.paused_prices);
    await trellis.apply('PAUSE TRANSFORM paused_prices');
    const [before] = await db.sql`SELECT price FROM paused_prices WHERE id = 1`;
    await db.sql`UPDATE widgets SET price = 777 WHERE id = 1`;
    await converge(D.widget_prices);
    const [during] = await db.sql`SELECT price FROM paused_prices WHERE id = 1`;
    expect(during?.price).toBe(before?.price);
    expect((await trellis.status('paused_prices')).status).toBe('paused');
    await trellis.apply('RESUME TRANSFORM paused_prices');
    await converge(D.paused_prices);
    const [after] = await db.sql`SELECT price FROM paused_prices WHERE id = 1`;
    expect(after?.price).toBe('777.00');
  });

  it('rebuilds a target on requestBackfill: emptied, then built again', async () => {
    await ensureDefined(D.widget_stock);
    // A row the definition does not produce, put in the target past its guard (as Trellis
    // itself writes): a rebuild empties the target first, so it must go.
    await db.sql.begin(async (tx) => {
      await tx`SELECT set_config('trellis.maintaining', 'trellis', true)`;
      await tx`INSERT INTO widget_stock (name, qty, id) VALUES ('stray', 1, 999999)`;
    });
    const requested = Date.now();
    await trellis.requestBackfill('widget_stock');
    await waitForStatus(trellis, 'widget_stock', 'live');
    // Built again after the request, not left as it was.
    const built = (await trellis.status('widget_stock')).backfill;
    expect(built?.startedAt.getTime()).toBeGreaterThanOrEqual(requested - 1_000);
    await converge(D.widget_stock);
    await expect(trellis.requestBackfill('nothing')).rejects.toMatchObject({ code: 'not_found' });
  });

  it('holds a key whose re-derivation fails, applies the rest, and retries it on RESUME', async () => {
    await db.sql.unsafe(`
      CREATE TABLE ratios (id int PRIMARY KEY, a int, b int);
      INSERT INTO ratios SELECT g, g, 1 + g % 3 FROM generate_series(1, 50) g;
    `);
    await trellis.apply(transformStatement(D.ratio_values));
    await converge(D.ratio_values);
    await db.sql.unsafe(`
      UPDATE ratios SET b = 0 WHERE id = 17;
      UPDATE ratios SET a = a + 100 WHERE id IN (16, 18, 40);
      INSERT INTO ratios VALUES (51, 10, 2);
    `);
    const token = await trellis.watermarkToken();
    await trellis.awaitConverged('ratio_values', token);
    const status = await trellis.status('ratio_values');
    expect(status.heldKeys).toBe(1);
    expect(status.status).toBe('live');
    const rows =
      await db.sql`SELECT id, ratio FROM ratio_values WHERE id IN (16, 17, 18, 40, 51) ORDER BY id`;
    expect(rows.map((r) => [r.id, r.ratio])).toEqual([
      [16, 116 / 2],
      [17, Math.trunc(17 / 3)], // held: still what it was
      [18, 118],
      [40, 140 / 2],
      [51, 5],
    ]);
    // Fix the row, resume: the held key is re-derived.
    await db.sql`UPDATE ratios SET b = 1 WHERE id = 17`;
    await trellis.apply('RESUME TRANSFORM ratio_values');
    await converge(D.ratio_values);
    expect((await trellis.status('ratio_values')).heldKeys).toBe(0);
  });

  it('captures writes made straight to a partition, including partitions created later', async () => {
    await db.sql.unsafe(`
      CREATE TABLE measurements (id int, site text, value numeric, PRIMARY KEY (id, site)) PARTITION BY LIST (site);
      CREATE TABLE measurements_a PARTITION OF measurements FOR VALUES IN ('a');
      CREATE TABLE measurements_b PARTITION OF measurements FOR VALUES IN ('b');
      INSERT INTO measurements SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g FROM generate_series(1, 100) g;
    `);
    await trellis.apply(transformStatement(D.doubled_measurements));
    await converge(D.doubled_measurements);
    await db.sql.unsafe(`
      UPDATE measurements_a SET value = value + 1000 WHERE id < 20;
      DELETE FROM measurements_b WHERE id > 90;
      INSERT INTO measurements_b VALUES (501, 'b', 5);
    `);
    await converge(D.doubled_measurements);
    await db.sql`CREATE TABLE measurements_c PARTITION OF measurements FOR VALUES IN ('c')`;
    await waitFor(() => captured('measurements_c'), 'capture on the new partition');
    await db.sql`INSERT INTO measurements_c VALUES (700, 'c', 7), (701, 'c', 8)`;
    await db.sql`INSERT INTO measurements VALUES (702, 'c', 9)`;
    await converge(D.doubled_measurements);
    await trellis.apply('DROP TRANSFORM doubled_measurements');
    await waitFor(
      async () =>
        !(await captured('measurements')) &&
        !(await captured('measurements_a')) &&
        !(await captured('measurements_c')) &&
        (
          await db.sql`SELECT count(*)::int AS n FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                        WHERE c.relname LIKE 'measurements%' AND NOT t.tgisinternal`
        )[0]!.n === 0,
      'capture to be removed from every partition',
    );
  });

  it('removes capture from a table nothing reads any more', async () => {
    await db.sql.unsafe(`
      CREATE TABLE lone_items (id int PRIMARY KEY, label text);
      INSERT INTO lone_items SELECT g, 'l' || g FROM generate_series(1, 10) g;`);
    const labels: Definition = {
      target: 'lone_labels',
      from: 'lone_items',
      select: 'label',
      implicit: 'id',
    };
    const shout: Definition = {
      target: 'lone_shout',
      from: 'lone_labels',
      select: 'upper(label) AS label',
      implicit: 'id',
      reads: [labels],
    };
    await ensureDefined(labels, shout);
    expect(await captured('lone_items')).toBe(true);
    await trellis.apply('DROP TRANSFORM lone_shout');
    await trellis.apply('DROP TRANSFORM lone_labels');
    await waitFor(async () => !(await captured('lone_items')), 'capture of lone_items to go');
  });
});
