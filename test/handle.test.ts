import { format, inspect } from 'node:util';
import type postgres from 'postgres';
import { describe, expect, it } from 'vitest';
import { DEFAULTS, Trellis, TrellisError } from '../src/engine/index.js';
import { MIGRATE_LOCK_CLASS } from '../src/engine/schema/install-sql.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import { scrape } from './support/prometheus.js';

// The handle's own behaviour: options, per-call deadlines, cancellation on the server,
// parallel calls, the pool cap and shutdown. Calls are blocked on real locks: migrate()
// waits on the installer's advisory lock, definitions() on a lock on a catalog table.

const quiet = { logger: { debug() {}, info() {}, warn() {}, error() {} } };

/**
 * Installs the schema with a handle of default deadlines: a test of a 1 s call deadline
 * must not spend it on the migrations themselves (a loaded machine can take longer).
 */
async function installSchema(db: TestDatabase): Promise<void> {
  await using installer = await Trellis.connect({ url: db.url, ...quiet });
  await installer.migrate();
}

let appCounter = 0;
/** An application_name no other test (or test file) uses, to find a handle's backends. */
function uniqueApp(label: string): string {
  appCounter += 1;
  return `trellis-test-${label}-${process.pid}-${appCounter}`;
}

/** Resolves to the rejection of `promise`, failing the test when it resolves instead. */
async function rejection(promise: Promise<unknown>): Promise<TrellisError> {
  const outcome = await promise.then(
    (value) => ({ value }),
    (error: unknown) => ({ error }),
  );
  if (!('error' in outcome)) {
    throw new Error(`expected a rejection, got ${JSON.stringify(outcome.value)}`);
  }
  expect(outcome.error).toBeInstanceOf(TrellisError);
  return outcome.error as TrellisError;
}

/** Polls `check` until it returns something other than undefined (or fails after a while). */
async function eventually<T>(
  what: string,
  check: () => Promise<T | undefined>,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 50)); // the poll interval of this wait
  }
}

interface Backend {
  pid: number;
  state: string | null;
  wait_event_type: string | null;
  query: string;
}

/** The handle's sessions as the server sees them. */
async function backends(db: TestDatabase, applicationName: string): Promise<Backend[]> {
  return db.sql<Backend[]>`
    SELECT pid, state, wait_event_type, query FROM pg_stat_activity
     WHERE application_name = ${applicationName} ORDER BY pid`;
}

/** Waits until one of the handle's sessions is waiting on a lock; returns it. */
function blockedBackend(db: TestDatabase, applicationName: string): Promise<Backend> {
  return eventually(`a ${applicationName} session waits on a lock`, async () =>
    (await backends(db, applicationName)).find(
      (b) => b.state === 'active' && b.wait_event_type === 'Lock',
    ),
  );
}

/** Waits until none of the handle's sessions is running a query. */
function nothingRunning(db: TestDatabase, applicationName: string): Promise<Backend[]> {
  return eventually(`no ${applicationName} session is active`, async () => {
    const all = await backends(db, applicationName);
    return all.some((b) => b.state === 'active') ? undefined : all;
  });
}

/** Waits until the handle has no session left on the server. */
function noBackends(db: TestDatabase, applicationName: string): Promise<true> {
  return eventually(`no ${applicationName} session is left`, async () =>
    (await backends(db, applicationName)).length === 0 ? true : undefined,
  );
}

/** Lock requests (granted or waiting) held by the handle's sessions. */
async function locksOf(db: TestDatabase, applicationName: string) {
  return db.sql<{ locktype: string; granted: boolean }[]>`
    SELECT l.locktype, l.granted FROM pg_locks l
      JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE a.application_name = ${applicationName} AND l.locktype = 'advisory'`;
}

/**
 * Holds the advisory lock migrate() takes for `schema`, from a session of the test's own,
 * so a migrate() call blocks on a real lock until `release`.
 */
async function holdMigrateLock(db: TestDatabase, schema = 'trellis') {
  // A client with one connection, not reserve() (see openTransaction in staging.test.ts).
  const conn = sqlClient(db.url, { max: 1 });
  await conn.unsafe('SELECT pg_advisory_lock($1, hashtext($2))', [MIGRATE_LOCK_CLASS, schema]);
  return {
    async release() {
      await conn.unsafe('SELECT pg_advisory_unlock($1, hashtext($2))', [
        MIGRATE_LOCK_CLASS,
        schema,
      ]);
      await conn.end({ timeout: 2 });
    },
  };
}

/** Holds an ACCESS EXCLUSIVE lock on the catalog table definitions() reads, until `release`. */
async function holdCatalogLock(db: TestDatabase, schema = 'trellis') {
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  let locked!: () => void;
  const isLocked = new Promise<void>((r) => {
    locked = r;
  });
  const tx = db.sql.begin(async (sql: postgres.TransactionSql) => {
    await sql.unsafe(`LOCK TABLE "${schema}".transforms IN ACCESS EXCLUSIVE MODE`);
    locked();
    await released;
  });
  await Promise.race([isLocked, tx]);
  return {
    async release() {
      release();
      await tx;
    },
  };
}

/** Tracks whether a promise has settled yet, without changing it. */
function track<T>(promise: Promise<T>) {
  const state = { settled: false, promise };
  promise.then(
    () => {
      state.settled = true;
    },
    () => {
      state.settled = true;
    },
  );
  return state;
}

describe('options', () => {
  it('config() returns the options with their defaults filled in', async () => {
    const db = await freshDatabase();
    await using trellis = await Trellis.connect({ url: db.url, ...quiet });
    expect(await trellis.config()).toEqual({
      schema: 'trellis',
      targetSchema: 'public',
      pool: { max: 10, acquireTimeoutMs: 5000 },
      staging: false,
      drainThreads: 0,
      callTimeoutMs: 30_000,
      applicationName: 'trellis-pg',
    });
    expect(DEFAULTS.callTimeoutMs).toBe(30_000);

    await db.sql`CREATE SCHEMA derived`;
    await using custom = await Trellis.connect({
      url: db.url,
      schema: 'catalog_b',
      targetSchema: 'derived',
      pool: { max: 3 },
      callTimeoutMs: 12_000,
      applicationName: 'billing-api',
      ...quiet,
    });
    expect(await custom.config()).toEqual({
      schema: 'catalog_b',
      targetSchema: 'derived',
      pool: { max: 3, acquireTimeoutMs: 5000 },
      staging: false,
      drainThreads: 0,
      callTimeoutMs: 12_000,
      applicationName: 'billing-api',
    });
    // What config() returns is a copy: changing it changes nothing.
    const seen = await custom.config();
    seen.pool.max = 99;
    expect((await custom.config()).pool.max).toBe(3);
  });

  it('prints only safe fields when inspected or serialised: never the url or its password', async () => {
    const db = await freshDatabase();
    {
      await using migrator = await Trellis.connect({ url: db.url, ...quiet });
      await migrator.migrate();
    }
    // The suite's server trusts local connections, so it ignores the password; the handle
    // still holds the url, and with it the password, in its options and its pool.
    const secret = 'pw-that-must-not-leak-7f3a';
    const url = new URL(db.url);
    url.password = secret;
    await using trellis = await Trellis.connect({
      url: url.toString(),
      staging: true,
      drainThreads: 1,
      ...quiet,
    });
    await trellis.definitions();
    const printed = [
      inspect(trellis, { depth: 10 }),
      inspect(trellis, { depth: 10, showHidden: true }),
      inspect({ handle: trellis }, { depth: 10 }),
      format('%o', trellis),
      JSON.stringify({ handle: trellis }),
    ];
    for (const text of printed) {
      expect(text).not.toContain(secret);
      expect(text).toContain(trellis.instance);
    }
    expect(inspect(trellis, { breakLength: Number.POSITIVE_INFINITY })).toBe(
      `Trellis { instance: '${db.name}/trellis', targetSchema: 'public', staging: true, drainThreads: 1 }`,
    );
    expect(JSON.parse(JSON.stringify(trellis))).toEqual({
      instance: `${db.name}/trellis`,
      targetSchema: 'public',
      staging: true,
      drainThreads: 1,
    });
  });

  it('refuses invalid options with validation errors, before connecting', async () => {
    const db = await freshDatabase();
    const cases: Array<[string, Parameters<typeof Trellis.connect>[0], string]> = [
      ['pool.max 0', { url: db.url, pool: { max: 0 } }, 'pool.max'],
      ['pool.max 1.5', { url: db.url, pool: { max: 1.5 } }, 'pool.max'],
      ['negative acquire timeout', { url: db.url, pool: { acquireTimeoutMs: -1 } }, 'acquire'],
      ['negative drainThreads', { url: db.url, drainThreads: -1 }, 'drainThreads'],
      ['fractional drainThreads', { url: db.url, drainThreads: 0.5 }, 'drainThreads'],
      ['drainThreads not a number', { url: db.url, drainThreads: '2' as never }, 'drainThreads'],
      ['callTimeoutMs 0', { url: db.url, callTimeoutMs: 0 }, 'callTimeoutMs'],
      ['empty url', { url: '' }, 'url'],
      ['no url', {} as never, 'url'],
      ['same schemas', { url: db.url, schema: 'x', targetSchema: 'x' }, 'differ'],
    ];
    for (const [label, options, mentions] of cases) {
      const error = await rejection(Trellis.connect({ ...options, ...quiet }));
      expect(error.code, label).toBe('validation');
      expect(error.message, label).toContain(mentions);
    }
  });

  it('refuses staging: true on a database where migrate() never ran (not_migrated)', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('staging');
    const error = await rejection(
      Trellis.connect({ url: db.url, staging: true, applicationName: app, ...quiet }),
    );
    expect(error.code).toBe('not_migrated');
    expect(error.message).toContain('migrate()');
    // The refused connect leaves no session behind.
    await noBackends(db, app);

    // Once migrated, the same options connect.
    {
      await using migrator = await Trellis.connect({ url: db.url, ...quiet });
      await migrator.migrate();
    }
    await using staging = await Trellis.connect({ url: db.url, staging: true, ...quiet });
    expect((await staging.config()).staging).toBe(true);
  });

  it('names its sessions trellis-pg, or the applicationName given', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('named');
    await using named = await Trellis.connect({ url: db.url, applicationName: app, ...quiet });
    await named.migrate();
    expect((await backends(db, app)).length).toBeGreaterThan(0);

    await using plain = await Trellis.connect({ url: db.url, ...quiet });
    await plain.definitions();
    const [row] = await db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_stat_activity
       WHERE application_name = 'trellis-pg' AND datname = ${db.name}`;
    expect(row?.n).toBeGreaterThan(0);
  });
});

describe('call deadlines', () => {
  it('a call stuck on a lock fails with timeout, and its query stops running on the server', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('timeout');
    await installSchema(db);
    await using trellis = await Trellis.connect({
      url: db.url,
      applicationName: app,
      callTimeoutMs: 1000,
      ...quiet,
    });
    await trellis.migrate();
    const lock = await holdMigrateLock(db);
    try {
      const started = Date.now();
      const error = await rejection(trellis.migrate());
      const took = Date.now() - started;
      expect(error.code).toBe('timeout');
      expect(error.message).toContain('1000 ms');
      // Settled at the deadline, not long after (generous: the machine may be busy).
      expect(took).toBeGreaterThanOrEqual(900);
      expect(took).toBeLessThan(6000);

      // The server is no longer running the query, and no longer waits for the lock.
      await nothingRunning(db, app);
      expect(await locksOf(db, app)).toEqual([]);
      // The lock holder is untouched.
      const [held] = await db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND classid = ${MIGRATE_LOCK_CLASS}
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`;
      expect(held?.n).toBe(1);

      // The handle goes on working.
      expect(await trellis.definitions()).toEqual([]);
    } finally {
      await lock.release();
    }
    expect(await trellis.migrate()).toMatchObject({ to: expect.any(Number) });
  });

  it('a read stuck behind a table lock fails with timeout, and is cancelled on the server', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('read-timeout');
    await installSchema(db);
    await using trellis = await Trellis.connect({
      url: db.url,
      applicationName: app,
      callTimeoutMs: 1000,
      ...quiet,
    });
    await trellis.migrate();
    await trellis.definitions(); // the handle now knows the schema is installed
    const lock = await holdCatalogLock(db);
    try {
      const call = trellis.definitions();
      const blocked = await blockedBackend(db, app);
      expect(blocked.query).toContain('definitions()');
      const error = await rejection(call);
      expect(error.code).toBe('timeout');
      await nothingRunning(db, app);
    } finally {
      await lock.release();
    }
    expect(await trellis.definitions()).toEqual([]);
  });

  it('runs calls in parallel: one stuck on a lock does not delay another', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('parallel');
    await using trellis = await Trellis.connect({ url: db.url, applicationName: app, ...quiet });
    await trellis.migrate();
    const lock = await holdMigrateLock(db);
    let stuck: ReturnType<typeof track<unknown>> | undefined;
    try {
      stuck = track(trellis.migrate());
      await blockedBackend(db, app);
      // Several other calls complete while migrate() waits.
      for (let i = 0; i < 3; i += 1) expect(await trellis.definitions()).toEqual([]);
      expect(await Promise.all([trellis.definitions(), trellis.definitions()])).toEqual([[], []]);
      expect(stuck.settled).toBe(false);
    } finally {
      await lock.release();
    }
    // Released, the stuck call completes normally.
    expect(await stuck.promise).toMatchObject({ to: expect.any(Number) });
  });
});

describe('the pool', () => {
  it('fails a call that cannot get a connection within pool.acquireTimeoutMs with timeout', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('pool');
    await using trellis = await Trellis.connect({
      url: db.url,
      applicationName: app,
      pool: { max: 1, acquireTimeoutMs: 300 },
      ...quiet,
    });
    await trellis.migrate();
    const lock = await holdMigrateLock(db);
    let stuck: ReturnType<typeof track<unknown>> | undefined;
    try {
      stuck = track(trellis.migrate());
      await blockedBackend(db, app);
      const error = await rejection(trellis.definitions());
      expect(error.code).toBe('timeout');
      expect(error.message).toContain('pool.max');
      // It gave up waiting for the connection, long before the call deadline (30 s).
      expect(stuck.settled).toBe(false);
      // The cap holds: the handle has one session.
      expect(await backends(db, app)).toHaveLength(1);
    } finally {
      await lock.release();
    }
    await stuck.promise;
    // The connection is free again.
    expect(await trellis.definitions()).toEqual([]);
  });

  it('lets a call waiting for a connection run once one comes free', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('pool-wait');
    await using trellis = await Trellis.connect({
      url: db.url,
      applicationName: app,
      pool: { max: 1, acquireTimeoutMs: 20_000 },
      ...quiet,
    });
    await trellis.migrate();
    const lock = await holdMigrateLock(db);
    let stuck: ReturnType<typeof track<unknown>> | undefined;
    let waiting: ReturnType<typeof track<unknown>> | undefined;
    try {
      stuck = track(trellis.migrate());
      await blockedBackend(db, app);
      waiting = track(trellis.definitions());
      // The waiter is queued behind the stuck call, as the handle's pool gauge shows (a
      // scrape's own catalog read waits too, and gives up after its timeout), and stays so.
      await eventually('the call to wait for a connection', async () => {
        const s = await scrape();
        const n = s.value('trellis_pool_waiting', {
          trellis_instance: `${db.name}/trellis`,
          pool: 'calls',
        });
        return n !== undefined && n >= 1 ? n : undefined;
      });
      expect(waiting.settled).toBe(false);
    } finally {
      await lock.release();
    }
    await stuck.promise;
    expect(await waiting.promise).toEqual([]);
  });
});

describe('shutdown()', () => {
  it('cancels calls in flight with shutdown, refuses later calls, and closes every session', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('shutdown');
    // The default call timeout (30 s): only shutdown can end the stuck calls quickly.
    const trellis = await Trellis.connect({ url: db.url, applicationName: app, ...quiet });
    await trellis.migrate();
    await trellis.definitions();
    const migrateLock = await holdMigrateLock(db);
    const catalogLock = await holdCatalogLock(db);
    try {
      const stuckMigrate = track(trellis.migrate());
      const stuckRead = track(trellis.definitions());
      await eventually('both calls wait on their locks', async () => {
        const waiting = (await backends(db, app)).filter((b) => b.wait_event_type === 'Lock');
        return waiting.length === 2 ? true : undefined;
      });

      const started = Date.now();
      await trellis.shutdown();
      // shutdown() did not wait for the calls' locks (they are still held), nor for the
      // 30 s call timeout: it cancelled them.
      expect(Date.now() - started).toBeLessThan(10_000);
      for (const call of [stuckMigrate, stuckRead]) {
        const error = await rejection(call.promise);
        expect(error.code).toBe('shutdown');
      }

      // Every session of the handle is gone, and with it its lock requests.
      await noBackends(db, app);
      expect(await locksOf(db, app)).toEqual([]);

      // Later calls reject the same way.
      for (const later of [trellis.migrate(), trellis.definitions(), trellis.config()]) {
        expect((await rejection(later)).code).toBe('shutdown');
      }
      // A second shutdown is harmless.
      await trellis.shutdown();
      await trellis[Symbol.asyncDispose]();
    } finally {
      await catalogLock.release();
      await migrateLock.release();
      await trellis.shutdown();
    }
  });

  it('turns away calls waiting for a pooled connection', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('shutdown-pool');
    const trellis = await Trellis.connect({
      url: db.url,
      applicationName: app,
      pool: { max: 1, acquireTimeoutMs: 20_000 },
      ...quiet,
    });
    await trellis.migrate();
    const lock = await holdMigrateLock(db);
    try {
      const stuck = track(trellis.migrate());
      await blockedBackend(db, app);
      const waiting = track(trellis.definitions());
      await trellis.shutdown();
      expect((await rejection(stuck.promise)).code).toBe('shutdown');
      expect((await rejection(waiting.promise)).code).toBe('shutdown');
      await noBackends(db, app);
    } finally {
      await lock.release();
      await trellis.shutdown();
    }
  });

  it('runs on leaving an `await using` block', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('dispose');
    let escaped: Trellis | undefined;
    {
      await using trellis = await Trellis.connect({ url: db.url, applicationName: app, ...quiet });
      escaped = trellis;
      await trellis.migrate();
      expect((await backends(db, app)).length).toBeGreaterThan(0);
    }
    await noBackends(db, app);
    expect((await rejection(escaped.definitions())).code).toBe('shutdown');
    await escaped.shutdown(); // harmless after disposal
  });

  it('is harmless twice, and concurrently', async () => {
    const db = await freshDatabase();
    const app = uniqueApp('twice');
    const trellis = await Trellis.connect({ url: db.url, applicationName: app, ...quiet });
    await trellis.migrate();
    await Promise.all([trellis.shutdown(), trellis.shutdown()]);
    await trellis.shutdown();
    await noBackends(db, app);
  });
});
