import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Trellis } from '../src/engine/index.js';
import { TEST_CAPTURE } from './support/capture-mode.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor, waitForStatus } from './support/trellis.js';

// Issue #21 item 2: a table a logical replication subscription writes. Postgres's apply
// worker fires row-level triggers only, so statement-level capture never saw the rows it
// applied: the target stayed stale while status said live. Set up as Postgres's docs say
// for a subscription within one cluster: the publisher's slot made by hand
// (pg_create_logical_replication_slot), the subscription made with create_slot = false.

let pub: TestDatabase;
let db: TestDatabase;
let trellis: Trellis;
const subscriptions: string[] = [];

function conninfo(url: string): string {
  const u = new URL(url);
  const parts = [
    `host=${decodeURIComponent(u.hostname)}`,
    `port=${u.port || '5432'}`,
    `dbname=${u.pathname.slice(1)}`,
    `user=${decodeURIComponent(u.username)}`,
  ];
  if (u.password) parts.push(`password=${decodeURIComponent(u.password)}`);
  return parts.join(' ');
}

/** Creates a subscription in `db` to `publication` of `pub`, through a slot made by hand. */
async function subscribe(name: string, publication: string): Promise<void> {
  const slot = `${name}_${process.pid}`;
  await pub.sql`SELECT pg_create_logical_replication_slot(${slot}, 'pgoutput')`;
  await db.sql.unsafe(
    `CREATE SUBSCRIPTION ${name} CONNECTION '${conninfo(pub.url)}' PUBLICATION ${publication}
       WITH (create_slot = false, slot_name = '${slot}')`,
  );
  subscriptions.push(name);
  await waitFor(
    async () => {
      const [row] = await db.sql<{ ready: boolean }[]>`
        SELECT coalesce(bool_and(sr.srsubstate = 'r'), false) AS ready
          FROM pg_subscription_rel sr JOIN pg_subscription s ON s.oid = sr.srsubid
         WHERE s.subname = ${name}`;
      return row?.ready === true;
    },
    `subscription ${name} to finish its initial copy`,
    60_000,
  );
}

/** Waits until the subscriber's copy of `table` holds what the publisher's does. */
async function caughtUp(table: string): Promise<void> {
  const digest = `SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) AS d FROM ${table} t`;
  const [want] = await pub.sql.unsafe<{ d: string }[]>(digest);
  await waitFor(
    async () => (await db.sql.unsafe<{ d: string }[]>(digest))[0]?.d === want?.d,
    `the subscriber's ${table} to catch up with the publisher's`,
    60_000,
  );
}

/** Writes on the publisher: inserts, updates (values and keys), deletes. */
async function writeOnPublisher(table: string, base: number): Promise<void> {
  await pub.sql.unsafe(`
    INSERT INTO ${table} SELECT ${base} + i, i, i % 5 FROM generate_series(1, 200) i;
    UPDATE ${table} SET v = v * 10 WHERE id % 3 = 0;
    UPDATE ${table} SET grp = grp + 1 WHERE id % 7 = 0;
    DELETE FROM ${table} WHERE id % 11 = 0;
    UPDATE ${table} SET id = id + 100000 WHERE id % 13 = 0;`);
  await pub.sql.unsafe(`INSERT INTO ${table} VALUES (${base} + 999, 1, 1)`);
  await pub.sql.unsafe(`UPDATE ${table} SET v = v + 1 WHERE id = ${base} + 999`);
}

beforeAll(async () => {
  pub = await freshDatabase();
  db = await freshDatabase();
  for (const sql of [pub.sql, db.sql]) {
    await sql.unsafe(`
      CREATE TABLE sub_early (id int PRIMARY KEY, v int NOT NULL, grp int NOT NULL);
      CREATE TABLE sub_late (id int PRIMARY KEY, v int NOT NULL, grp int NOT NULL);`);
  }
  await pub.sql.unsafe(`
    INSERT INTO sub_early SELECT i, i, i % 5 FROM generate_series(1, 300) i;
    INSERT INTO sub_late SELECT i, i, i % 5 FROM generate_series(1, 300) i;
    CREATE PUBLICATION pub_early FOR TABLE sub_early;
    CREATE PUBLICATION pub_late FOR TABLE sub_late;`);
  trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
});
afterAll(async () => {
  await trellis?.shutdown();
  // The publisher's slots go with its database (the harness drops them); the subscription
  // must not try to, nor keep its workers on the subscriber's database.
  for (const name of subscriptions) {
    await db.sql.unsafe(`ALTER SUBSCRIPTION ${name} DISABLE`);
    await db.sql.unsafe(`ALTER SUBSCRIPTION ${name} SET (slot_name = NONE)`);
    await db.sql.unsafe(`DROP SUBSCRIPTION ${name}`);
  }
});

describe(`a logical replication subscriber's tables (${TEST_CAPTURE} capture)`, () => {
  it('rows a subscription applies reach the targets of a table subscribed before its transforms were defined', async () => {
    await subscribe('sub_early_s', 'pub_early');
    const rows: Definition = {
      target: 'sub_early_rows',
      from: 'sub_early',
      select: 'v, grp',
      implicit: 'id',
    };
    const groups: Definition = {
      target: 'sub_early_groups',
      from: 'sub_early',
      select: 'grp, count(*) AS n, sum(v) AS total',
      groupBy: 'grp',
    };
    for (const d of [rows, groups]) await trellis.apply(transformStatement(d));
    for (const d of [rows, groups]) await waitForStatus(trellis, d.target, 'live', 60_000);
    const status = await trellis.status(rows.target);
    expect(status.capture.sources).toMatchObject([{ table: 'public.sub_early', subscribed: true }]);

    await writeOnPublisher('sub_early', 1000);
    await caughtUp('sub_early');
    const token = await trellis.watermarkToken();
    for (const d of [rows, groups]) {
      await trellis.awaitConverged(d.target, token, { timeoutMs: 30_000 });
      await expectMatchesDefinition(db.sql, d);
    }
    expect((await trellis.status(rows.target)).status).toBe('live');
  });

  it('a captured table that becomes a subscription target later is noticed, and its targets follow', async () => {
    const d: Definition = {
      target: 'sub_late_rows',
      from: 'sub_late',
      select: 'v * 2 AS v2, grp',
      implicit: 'id',
    };
    await trellis.apply(transformStatement(d));
    await waitForStatus(trellis, d.target, 'live', 60_000);
    expect((await trellis.status(d.target)).capture.sources).toMatchObject([
      { table: 'public.sub_late', subscribed: false },
    ]);

    // The initial copy brings 300 rows; then the publisher's writes are applied row by row.
    await subscribe('sub_late_s', 'pub_late');
    await writeOnPublisher('sub_late', 2000);
    await caughtUp('sub_late');
    await waitFor(
      async () => (await trellis.status(d.target)).capture.sources[0]?.subscribed === true,
      'status to show sub_late as subscribed',
    );
    if (TEST_CAPTURE !== 'logical') {
      // The row trigger is in place once the staging worker noticed the subscription.
      await waitFor(async () => {
        const [row] = await db.sql<{ n: number }[]>`
          SELECT count(*)::int AS n FROM pg_trigger
           WHERE tgrelid = 'sub_late'::regclass AND tgname = 'trellis_capture_row' AND tgenabled = 'R'`;
        return row?.n === 1;
      }, 'the row capture trigger on sub_late');
      // More writes once it is there, applied only row by row.
      await pub.sql.unsafe(
        'UPDATE sub_late SET v = v + 5 WHERE id % 2 = 0; DELETE FROM sub_late WHERE id % 17 = 0',
      );
      await caughtUp('sub_late');
    }
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 30_000 });
    await expectMatchesDefinition(db.sql, d);
    expect((await trellis.status(d.target)).status).toBe('live');
  });
});
