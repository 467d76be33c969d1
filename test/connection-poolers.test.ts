import type postgres from 'postgres';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Trellis, TrellisError } from '../src/engine/index.js';
import { LOCK_CLASS } from '../src/engine/internal/advisory-locks.js';
import { TEST_CAPTURE } from './support/capture-mode.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { PgBouncer, pgbouncerAvailable } from './support/pgbouncer.js';
import {
  migratedTrellis,
  quietLogger,
  rejection,
  waitFor,
  waitForStatus,
} from './support/trellis.js';

// Trellis through PgBouncer (Debian's 1.18, started by the harness like Postgres; issue
// #21 item 5, ADR 0037). In session pooling (PgBouncer's default) the whole pipeline works
// with PgBouncer's default settings: no startup parameter it does not know, one elected
// staging worker and WAL decoder however many handles stand by, and shutdowns that cancel
// through it without crashing it. Transaction pooling is refused at connect with a coded
// error, before a worker could be elected twice on one pooled server session.

/**
 * Startup parameters the engine sent before this change. The transaction-pooling tests
 * tell PgBouncer to ignore them (as the user did), so connecting fails for the
 * reason under test and not for these.
 */
const IGNORED = [
  'statement_timeout',
  'default_transaction_isolation',
  'idle_in_transaction_session_timeout',
  'work_mem',
];

const available = pgbouncerAvailable('connection-poolers.test.ts');

let db: TestDatabase;
const bouncers: PgBouncer[] = [];
const handles: Trellis[] = [];
const appClients: postgres.Sql[] = [];

/** The app's own client, through `pool` (closed after each test). */
function appClient(pool: PgBouncer): postgres.Sql {
  const client = sqlClient(pool.url(db.name), { max: 1 });
  appClients.push(client);
  return client;
}

async function bouncer(
  poolMode: 'session' | 'transaction' | 'statement',
  ignoreStartupParameters: string[] = [],
): Promise<PgBouncer> {
  const started = await PgBouncer.start({
    serverUrl: db.url,
    poolMode,
    ignoreStartupParameters,
  });
  bouncers.push(started);
  return started;
}

/** A handle the test shuts down afterwards, with a logger that records "elected" lines. */
async function connect(
  url: string,
  options: { staging?: boolean; drainThreads?: number; applicationName?: string } = {},
  elected: string[] = [],
): Promise<Trellis> {
  const handle = await Trellis.connect({
    url,
    ...options,
    logger: {
      ...quietLogger,
      info(fields: object, message: string) {
        if (message.endsWith(' elected')) elected.push(message);
        quietLogger.info(fields, message);
      },
    },
  });
  handles.push(handle);
  return handle;
}

/** Sessions of this database holding the advisory lock of `lockClass` for schema trellis. */
async function holders(lockClass: number): Promise<number[]> {
  const rows = await db.sql<{ pid: number }[]>`
    SELECT l.pid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.classid = ${lockClass}::oid
       AND l.objid = ((hashtext('trellis')::bigint + 4294967296) % 4294967296)::oid
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`;
  return rows.map((r) => r.pid);
}

beforeAll(async () => {
  if (!available) return;
  db = await freshDatabase();
  const installer = await migratedTrellis(db);
  await installer.shutdown();
});

afterEach(async () => {
  for (const handle of handles.splice(0)) await handle.shutdown();
  for (const client of appClients.splice(0)) await client.end({ timeout: 2 });
});

afterAll(async () => {
  for (const b of bouncers.splice(0)) await b.stop();
});

describe.skipIf(!available)('through PgBouncer', () => {
  it('works end to end in session pooling, with PgBouncer left at its defaults', async () => {
    const pool = await bouncer('session');
    await db.sql.unsafe(`
      CREATE TABLE pool_orders (id int PRIMARY KEY, customer int NOT NULL, amount numeric NOT NULL);
      CREATE INDEX ON pool_orders (customer);
      INSERT INTO pool_orders SELECT g, g % 17, g * 1.5 FROM generate_series(1, 2000) g;`);
    const totals: Definition = {
      target: 'pool_totals',
      from: 'pool_orders',
      select: 'customer, count(*) AS n, sum(amount) AS total',
      groupBy: 'customer',
    };
    const big: Definition = {
      target: 'pool_big',
      from: 'pool_orders',
      select: 'customer, amount',
      where: 'amount > 1000',
      implicit: 'id',
    };
    // Before: "unsupported startup parameter: statement_timeout" from PgBouncer itself.
    const worker = await connect(pool.url(db.name), { staging: true, drainThreads: 2 });
    for (const d of [totals, big]) await worker.define(transformStatement(d));
    // The app writes through the same pooler while the targets are built and after.
    const app = appClient(pool);
    for (let round = 0; round < 5; round += 1) {
      await app.unsafe(`
        INSERT INTO pool_orders SELECT g, g % 23, g * 0.25 FROM generate_series(${3000 + round * 100}, ${3099 + round * 100}) g;
        UPDATE pool_orders SET amount = amount + 700 WHERE id % 50 = ${round};
        DELETE FROM pool_orders WHERE id % 97 = ${round};`);
    }
    const token = await worker.watermarkToken();
    for (const d of [totals, big]) {
      await worker.awaitConverged(d.target, token, { timeoutMs: 60_000 });
      await expectMatchesDefinition(db.sql, d);
      await waitForStatus(worker, d.target, 'live');
    }
    // The workers report passing through the pooler. Under WAL capture the decoder cannot
    // stream through PgBouncer 1.18 (no replication connections): it says so, no slot is
    // made, and the sources stay on their triggers (the targets converged above).
    if (TEST_CAPTURE === 'logical') {
      await waitFor(
        async () => (await worker.status('pool_totals')).workerFailure?.role === 'decoder',
        'the WAL decoder reporting why it cannot stream',
      );
      const failure = (await worker.status('pool_totals')).workerFailure;
      expect(failure?.error).toContain('connection pooler');
      expect(failure?.error).toContain('directly');
      const [slot] = await db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM pg_replication_slots WHERE database = current_database()`;
      expect(slot?.n).toBe(0);
    } else {
      await waitFor(async () => {
        const s = await worker.status('pool_totals');
        return s.workerFailure === null && s.workers.staging.passing === true;
      }, 'the workers reporting through the pooler');
    }
  });

  it('refuses transaction and statement pooling at connect, with a coded error saying what to do', async () => {
    for (const mode of ['transaction', 'statement'] as const) {
      const pool = await bouncer(mode, IGNORED);
      for (const options of [{ staging: true, drainThreads: 1 }, {}]) {
        const error = await rejection(connect(pool.url(db.name), options));
        expect(error).toBeInstanceOf(TrellisError);
        expect(error.code).toBe('transaction_pooling');
        expect(error.message).toContain('session');
        expect(error.message).toContain('directly');
      }
    }
  });

  it('never elects two staging workers or WAL decoders through the pooler', async () => {
    // Transaction pooling: before, both handles connected and both elected themselves WAL
    // decoder (the lock stayed on a pooled server session the other then ran on).
    const transaction = await bouncer('transaction', IGNORED);
    const electedThere: string[] = [];
    for (const name of ['a', 'b']) {
      await connect(
        transaction.url(db.name),
        { staging: true, applicationName: `pool-tx-${name}` },
        electedThere,
      ).catch((error: unknown) => {
        expect((error as TrellisError).code).toBe('transaction_pooling');
      });
    }
    expect(electedThere).toEqual([]);

    // Session pooling: one of two standing-by handles is elected, and the other takes
    // over when it goes.
    const session = await bouncer('session');
    const byFirst: string[] = [];
    const bySecond: string[] = [];
    const first = await connect(session.url(db.name), { staging: true }, byFirst);
    const second = await connect(session.url(db.name), { staging: true }, bySecond);
    await waitFor(
      async () =>
        (await holders(LOCK_CLASS.staging)).length === 1 &&
        (await holders(LOCK_CLASS.wal)).length === 1,
      'a staging worker and a WAL decoder elected',
    );
    // The standing-by staging worker and WAL decoder (whichever handle each is in) have
    // each tried their lock again, twice, since both were elected: they had their chances
    // to be elected too. Told by the try's statement starting again on their sessions
    // (pg_stat_activity's query_start only moves forward: not a sample of what runs).
    for (let turn = 1; turn <= 2; turn += 1) {
      const [mark] = await db.sql<{ at: string }[]>`SELECT clock_timestamp()::text AS at`;
      await waitFor(async () => {
        const [row] = await db.sql<{ n: number }[]>`
          SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE datname = current_database() AND query LIKE 'SELECT pg_try_advisory_lock($1, hashtext($2))%'
             AND query_start > ${mark!.at}::timestamptz`;
        return row!.n >= 2;
      }, `turn ${turn} of the standbys at their locks`);
    }
    expect(await holders(LOCK_CLASS.staging)).toHaveLength(1);
    expect(await holders(LOCK_CLASS.wal)).toHaveLength(1);
    const elected = [...byFirst, ...bySecond];
    expect(elected.filter((m) => m === 'staging worker elected')).toHaveLength(1);
    // The decoder's election is told at info only under WAL capture: under triggers it idles.
    expect(elected.filter((m) => m === 'WAL decoder elected')).toHaveLength(
      TEST_CAPTURE === 'logical' ? 1 : 0,
    );

    const leader = byFirst.includes('staging worker elected') ? first : second;
    const standbyLog = leader === first ? bySecond : byFirst;
    const [before] = await holders(LOCK_CLASS.staging);
    handles.splice(handles.indexOf(leader), 1);
    await leader.shutdown();
    // The lock shows in pg_locks a moment before the standby reads its answer and logs
    // the election (CI saw the lock first): both are waited for.
    await waitFor(async () => {
      const now = await holders(LOCK_CLASS.staging);
      return now.length === 1 && now[0] !== before && standbyLog.includes('staging worker elected');
    }, 'the standby elected after the leader shut down, and saying so');
    expect(await holders(LOCK_CLASS.staging)).toHaveLength(1);
  });

  it("shuts down through the pooler without crashing it or dropping the app's connections", async () => {
    // The setup: every startup parameter ignored so that the handles of the
    // version before could connect at all.
    const pool = await bouncer('session', IGNORED);
    const app = appClient(pool);
    const [before] = await app<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
    for (let round = 0; round < 6; round += 1) {
      const handle = await connect(pool.url(db.name), {
        staging: round % 2 === 0,
        drainThreads: 2,
      });
      // Its workers are inside their waits (a statement each), which shutdown cancels.
      await waitFor(
        async () => (await handle.hasLiveDrainWorkers()) === true,
        'the drain loops registered',
      );
      handles.splice(handles.indexOf(handle), 1);
      await handle.shutdown();
      expect(pool.running).toBe(true);
    }
    const log = await pool.log();
    expect(log).not.toContain('FATAL');
    // The app's client kept its connection (and so its server session) throughout.
    const [after] = await app<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
    expect(after?.pid).toBe(before?.pid);
  });
});
