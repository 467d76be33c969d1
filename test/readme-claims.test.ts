import { describe, expect, it } from 'vitest';
import { Trellis, TrellisError } from '../src/engine/index.js';
import { freshDatabase } from './support/database.js';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { quietLogger, rejection, waitFor, waitForStatus } from './support/trellis.js';

// What the README says and no other test checked (issue #10 item 6): lag figures, ALTER
// and column RESUME rebuilding data, the search_path captured at define time, temporary
// tables refused, not_migrated from every method, and the logger's contract.

const live = livePipeline();

describe('what the README claims', () => {
  it('status().lag counts the segments and seconds a transform is behind, and 0 once caught up', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE lag_items (id int PRIMARY KEY, v int NOT NULL);
      INSERT INTO lag_items SELECT i, i FROM generate_series(1, 50) i;`);
    const d: Definition = { target: 'lag_t', from: 'lag_items', select: 'v', implicit: 'id' };
    await live.define(d);
    await live.converged(d);
    expect((await live.trellis.status(d.target)).lag).toEqual({ segments: 0, seconds: 0 });
    await live.trellis.apply('PAUSE TRANSFORM lag_t');
    // A segment per tick, and ticks come only with writes (ADR 0012); writes close together
    // can share one (a busy staging worker): write until there are three.
    let id = 0;
    await waitFor(async () => {
      id = (id % 50) + 1;
      const [before] = await live.db.sql<{ seq: string | null }[]>`
        SELECT max(seq)::text AS seq FROM trellis.ticks`;
      await live.db.sql`UPDATE lag_items SET v = v + 1 WHERE id = ${id}`;
      // The write's own tick, before the next write (rather than a pause that hopes so).
      await waitFor(async () => {
        const [now] = await live.db.sql<{ newer: boolean }[]>`
          SELECT coalesce(max(seq) > ${before?.seq ?? '0'}::bigint, false) AS newer FROM trellis.ticks`;
        return now?.newer === true;
      }, 'a tick after the write');
      return (await live.trellis.status(d.target)).lag.segments >= 3;
    }, 'the paused transform to fall three segments behind');
    // The seconds behind grow while it stays paused.
    await waitFor(
      async () => (await live.trellis.status(d.target)).lag.seconds > 0.2,
      'the paused transform to be more than 0.2 s behind',
    );
    const behind = (await live.trellis.status(d.target)).lag;
    expect(behind.seconds).toBeGreaterThan(0.2);
    await live.trellis.apply('RESUME TRANSFORM lag_t');
    await live.converged(d);
    expect((await live.trellis.status(d.target)).lag).toEqual({ segments: 0, seconds: 0 });
  });

  it('ALTER … ADD COLUMN and DROP COLUMN change the target; RESUME of a paused column rebuilds it', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE alt_items (id int PRIMARY KEY, price numeric NOT NULL, qty int NOT NULL);
      INSERT INTO alt_items SELECT i, i, i % 7 FROM generate_series(1, 100) i;`);
    const d: Definition = { target: 'alt_t', from: 'alt_items', select: 'price', implicit: 'id' };
    await live.define(d);
    await live.trellis.apply('ALTER TRANSFORM alt_t ADD COLUMN qty * 2 AS twice');
    const added: Definition = { ...d, select: 'price, qty * 2 AS twice' };
    await waitForStatus(live.trellis, d.target, 'live');
    await live.converged(added);
    // A paused column stays as it is while its rows change; its RESUME rebuilds it.
    await live.trellis.apply('PAUSE TRANSFORM alt_t.twice');
    await live.db.sql`UPDATE alt_items SET qty = qty + 100 WHERE id <= 10`;
    await live.db.sql`UPDATE alt_items SET price = 0 WHERE id = 11`;
    const token = await live.trellis.watermarkToken();
    await live.trellis.awaitConverged(d.target, token);
    const [frozen] = await live.db.sql`SELECT twice FROM alt_t WHERE id = 1`;
    expect(frozen?.twice).toBe(2);
    const [moved] = await live.db.sql`SELECT price FROM alt_t WHERE id = 11`;
    expect(moved?.price).toBe('0');
    await live.trellis.apply('RESUME TRANSFORM alt_t.twice');
    await waitForStatus(live.trellis, d.target, 'live');
    await live.converged(added);
    await live.trellis.apply('ALTER TRANSFORM alt_t DROP COLUMN twice');
    await live.converged(d);
  });

  it('resolves a definition’s names through the search_path it was defined under, whatever sessions use later', async () => {
    await live.db.sql.unsafe(`
      CREATE SCHEMA shop;
      CREATE TABLE shop.items (id int PRIMARY KEY, cents int NOT NULL);
      CREATE FUNCTION shop.euros(c int) RETURNS numeric LANGUAGE sql IMMUTABLE AS $$ SELECT c / 100.0 $$;
      INSERT INTO shop.items SELECT i, i * 150 FROM generate_series(1, 40) i;`);
    // Defined from SQL in a session whose search_path finds shop's table and function
    // unqualified (as a migration with its own search_path would).
    await live.db.sql.begin(async (tx) => {
      await tx`SET LOCAL search_path = shop, public`;
      await tx`SELECT trellis.apply('TRANSFORM shop_euros FROM items SELECT euros(cents) AS euros')`;
    });
    const d: Definition = {
      target: 'shop_euros',
      from: 'items',
      select: 'euros(cents) AS euros',
      implicit: 'id',
    };
    await waitForStatus(live.trellis, d.target, 'live');
    await live.db.sql`UPDATE shop.items SET cents = 1 WHERE id <= 5`;
    await live.trellis.awaitConverged(d.target, await live.trellis.watermarkToken());
    await expectMatchesDefinition(live.db.sql, d, { searchPath: 'shop, public' });
  });

  it('refuses a temporary table as a source', async () => {
    const refused = await rejection(
      live.db.sql.begin(async (tx) => {
        await tx`CREATE TEMP TABLE scratch (id int PRIMARY KEY, v int)`;
        await tx`SELECT trellis.apply('TRANSFORM from_scratch FROM scratch SELECT v')`;
      }),
    );
    expect(refused.code).toBe('TRV01');
    expect(refused.message).toContain('temporary table');
  });
});

describe('a handle on a database where migrate() never ran', () => {
  it('fails every method that reads or changes the catalog with not_migrated', async () => {
    const db = await freshDatabase();
    await using trellis = await Trellis.connect({ url: db.url, logger: quietLogger });
    const calls: Array<[string, () => Promise<unknown>]> = [
      ['apply', () => trellis.apply('TRANSFORM t FROM x SELECT a')],
      ['define', () => trellis.define('TRANSFORM t FROM x SELECT a')],
      ['status', () => trellis.status('t')],
      ['definitions', () => trellis.definitions()],
      ['requestBackfill', () => trellis.requestBackfill('t')],
      ['awaitConverged', async () => trellis.awaitConverged('t', await trellis.watermarkToken())],
      ['quarantined', () => trellis.quarantined()],
      ['quarantineStatus', () => trellis.quarantineStatus('t')],
      ['sampleQuarantined', () => trellis.sampleQuarantined('t')],
      ['poisonedSince', () => trellis.poisonedSince(new Date())],
      ['releaseKey', () => trellis.releaseKey('t', 'public.x', '1')],
      ['detectCaptureDisruptions', () => trellis.detectCaptureDisruptions()],
      ['selfCheck', () => trellis.selfCheck('t', 'full')],
      ['selfCheckJob', () => trellis.selfCheckJob('00000000-0000-4000-8000-000000000000')],
    ];
    const codes: Record<string, string> = {};
    for (const [name, call] of calls) codes[name] = (await rejection(call())).code as string;
    expect(codes).toEqual(Object.fromEntries(calls.map(([name]) => [name, 'not_migrated'])));
  });
});

describe('the logger', () => {
  it('gets lines carrying trellis_instance, and a throwing logger is ignored', async () => {
    const db = await freshDatabase();
    const lines: Array<{ level: string; obj: Record<string, unknown>; msg: string }> = [];
    const capture = (level: string) => (obj: Record<string, unknown>, msg: string) => {
      lines.push({ level, obj, msg });
    };
    {
      await using migrator = await Trellis.connect({ url: db.url, logger: quietLogger });
      await migrator.migrate();
    }
    await using _worker = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 1,
      logger: {
        debug: capture('debug'),
        info: capture('info'),
        warn: capture('warn'),
        error: capture('error'),
      },
    });
    await waitFor(async () => lines.some((l) => l.msg === 'staging worker elected'), 'a log line');
    for (const line of lines) expect(line.obj.trellis_instance).toBe(`${db.name}/trellis`);

    const explode = () => {
      throw new Error('logger down');
    };
    await using careless = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 1,
      logger: { debug: explode, info: explode, warn: explode, error: explode },
    });
    await db.sql.unsafe(
      'CREATE TABLE logged (id int PRIMARY KEY, v int); INSERT INTO logged VALUES (1, 1)',
    );
    await careless.apply(transformStatement({ target: 'logged_t', from: 'logged', select: 'v' }));
    await waitForStatus(careless, 'logged_t', 'live');
    expect(await careless.hasLiveDrainWorkers()).toBe(true);
    expect((await rejection(careless.status('nope'))) instanceof TrellisError).toBe(true);
  });
});
