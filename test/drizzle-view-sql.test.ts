import { eq, exists, getTableName, inArray, sql } from 'drizzle-orm';
import { integer, pgTable, QueryBuilder, text } from 'drizzle-orm/pg-core';
import { drizzle } from 'drizzle-orm/postgres-js';
import { describe, expect, it, onTestFinished } from 'vitest';
import {
  sourceIndexesOf,
  statementOf,
  subquery,
  transform,
  transformDefinition,
} from '../src/drizzle/index.js';
import { sqlClient } from './support/database.js';
import {
  activeUsers,
  allEvents,
  bigOrders,
  buyingUsers,
  customerSpend,
  firstOrders,
  idleCustomers,
  largestOrder,
  northOrders,
  orderCounts,
  payingCustomers,
  TABLES,
  topRegionOrders,
  unblockedOrders,
  vBlocked,
  vCustomers,
  vOrders,
  webEvents,
} from './support/drizzle-view-sql.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

// View SQL written through the drizzle builder (issue #26, ADR 0078). Each target is
// defined by the builder's statement and compared, after every step of writes, with the
// SQL a user would write for it, as the test wrote it here, run by Postgres (the oracle).

const paying: Definition = {
  form: 'as',
  target: 'paying_customers',
  select: 'c.id, c.name',
  from: 'v_customers c',
  where: `EXISTS (SELECT 1 FROM v_orders o WHERE o.customer_id = c.id AND o.status = 'paid')`,
};
const idle: Definition = {
  form: 'as',
  target: 'idle_customers',
  select: 'c.id, c.region',
  from: 'v_customers c',
  where: 'NOT EXISTS (SELECT o.id FROM v_orders o WHERE o.customer_id = c.id)',
};
const north: Definition = {
  form: 'as',
  target: 'north_orders',
  select: 'o.id, o.amount',
  from: 'v_orders o',
  // paying_customers recomputed from its own definition, never read from its target.
  where: `o.customer_id IN (SELECT p.id FROM (${'SELECT c.id, c.name FROM v_customers c'}
            WHERE ${paying.where}) p JOIN v_customers c ON c.id = p.id WHERE c.region = 'north')`,
};
const unblocked: Definition = {
  form: 'as',
  target: 'unblocked_orders',
  select: 'o.id, o.customer_id AS "customerId"',
  from: 'v_orders o',
  where: 'o.amount > 1 AND o.customer_id NOT IN (SELECT b.customer_id FROM v_blocked b)',
};
const events: Definition = {
  form: 'as',
  target: 'all_events',
  select: `id, user_id AS "userId", kind, 'web' AS src FROM web_events
           UNION ALL SELECT id, user_id, kind, 'app'`,
  // The two columns the target adds to tell its rows apart (ADR 0059): branch, row key.
  oracleSelect: `id, user_id AS "userId", kind, 'web' AS src, 1 AS "trellis#branch",
                 ROW(id)::text AS "trellis#key" FROM web_events
                 UNION ALL SELECT id, user_id, kind, 'app'`,
  implicit: '2, ROW(id)::text',
  from: 'app_events',
  where: 'user_id > 0',
};
const active: Definition = {
  form: 'as',
  target: 'active_users',
  select: 'user_id AS "userId"',
  from: `web_events UNION SELECT user_id FROM app_events
         EXCEPT SELECT customer_id FROM v_blocked WHERE customer_id IS NOT NULL`,
};
const largest: Definition = {
  form: 'as',
  target: 'largest_order',
  select: 'DISTINCT ON (customer_id) customer_id AS "customerId", id, amount',
  // The ORDER BY picks each customer's row: the oracle runs it (an orderBy it would drop).
  from: `v_orders WHERE status = 'paid' ORDER BY customer_id, amount DESC, id DESC`,
};
const topRegion: Definition = {
  form: 'as',
  target: 'top_region_orders',
  select: 'r.id, r.name AS "buyerName", r.amount',
  // The join's rows are keyed by both tables' keys: the buyer's is a column of the target.
  implicit: 'r.buyer_id',
  from: `(SELECT o.id, b.name, o.amount, b.id AS buyer_id,
                 rank() OVER (PARTITION BY b.name ORDER BY o.amount DESC) AS rk
            FROM v_orders o JOIN v_customers b ON b.id = o.customer_id) r`,
  where: 'r.rk <= 2',
};
const first: Definition = {
  form: 'as',
  target: 'first_orders',
  select: 'f.id, f.customer_id AS "customerId", f.status',
  from: `(SELECT id, customer_id, status,
                 row_number() OVER (PARTITION BY customer_id ORDER BY id) AS rn FROM v_orders) f`,
  where: 'f.rn <= 2',
};

const big: Definition = {
  form: 'as',
  target: 'big_orders',
  select: 'o.id, o.amount',
  from: 'v_orders o',
  where: `o.amount > (SELECT avg(p.amount) FROM v_orders p WHERE p.status = 'paid')`,
  // An uncorrelated scalar subquery is a one-row part, its key a column (ADR 0058).
  implicit: 'true AS "trellis#one"',
};
const buying: Definition = {
  form: 'as',
  target: 'buying_users',
  select: `"userId" FROM (SELECT user_id AS "userId" FROM web_events
           UNION SELECT user_id FROM app_events) u INTERSECT SELECT customer_id`,
  from: 'v_orders',
};

const PER_CUSTOMER = `(SELECT customer_id, sum(amount) AS total, count(*) AS n
                         FROM v_orders GROUP BY customer_id) AS p`;
const spend: Definition = {
  form: 'as',
  target: 'customer_spend',
  select: 'c.id, c.name, p.total',
  from: `v_customers c JOIN ${PER_CUSTOMER} ON p.customer_id = c.id`,
  where: 'p.n > 1',
  // The part's key, carried as a column (ADR 0056), named as the builder's derived table names it.
  implicit: 'p.customer_id AS "customerId"',
};
const counts: Definition = {
  form: 'as',
  target: 'order_counts',
  select: 'p.n, count(*) AS customers',
  from: PER_CUSTOMER,
  groupBy: 'p.n',
};

const TARGETS = [
  payingCustomers,
  idleCustomers,
  northOrders,
  unblockedOrders,
  allEvents,
  activeUsers,
  largestOrder,
  topRegionOrders,
  firstOrders,
  bigOrders,
  buyingUsers,
  customerSpend,
  orderCounts,
];
const DEFINITIONS = [
  paying,
  idle,
  north,
  unblocked,
  events,
  active,
  largest,
  topRegion,
  first,
  big,
  buying,
  spend,
  counts,
];

describe('view SQL through the builder: the statements', () => {
  it('writes the AS form, with each subquery in place and its targets as reads', () => {
    expect(statementOf(payingCustomers)).toBe(
      [
        'TRANSFORM "paying_customers" AS',
        'SELECT "v_customers"."id" AS "id", "v_customers"."name" AS "name"',
        'FROM "v_customers"',
        `WHERE exists (SELECT 1 AS "one" FROM "v_orders" WHERE ("v_orders"."customer_id" = "v_customers"."id" and "v_orders"."status" = 'paid'))`,
      ].join('\n'),
    );
    expect(statementOf(unblockedOrders)).toContain(
      `"v_orders"."customer_id" not in (SELECT "v_blocked"."customer_id" AS "customerId" FROM "v_blocked")`,
    );
    // A target read inside a subquery is read by the statement: defined first.
    expect(transformDefinition(northOrders).reads).toEqual(['paying_customers']);
    expect(statementOf(largestOrder)).toContain(
      'ORDER BY "v_orders"."customer_id", "v_orders"."amount" desc, "v_orders"."id" desc',
    );
    expect(statementOf(firstOrders)).toContain('WHERE "ranked"."trellis_rank" <= 2');
    expect(statementOf(allEvents).split('\n')).toContain('UNION ALL');
    expect(statementOf(orderCounts).split('\n')).toEqual([
      'TRANSFORM "order_counts" AS',
      'SELECT "per_customer"."n" AS "n", count(*) AS "customers"',
      'FROM (SELECT "v_orders"."customer_id" AS "customerId", sum("v_orders"."amount") AS "total", count(*) AS "n" FROM "v_orders" GROUP BY "v_orders"."customer_id") AS "per_customer"',
      'GROUP BY "per_customer"."n"',
    ]);
    expect(statementOf(buyingUsers).split('\n').slice(1)).toEqual([
      '(',
      'SELECT "web_events"."user_id" AS "userId"',
      'FROM "web_events"',
      'UNION',
      'SELECT "app_events"."user_id" AS "userId"',
      'FROM "app_events"',
      ')',
      'INTERSECT',
      'SELECT "v_orders"."customer_id" AS "userId"',
      'FROM "v_orders"',
    ]);
    // A set operation's lookups are each SELECT's (none here: no join, no GROUP BY).
    expect(sourceIndexesOf(allEvents)).toEqual([]);
    expect(sourceIndexesOf(topRegionOrders).map((i) => [getTableName(i.table), i.names])).toEqual([
      ['buyer', ['id']],
      ['v_orders', ['customer_id']],
    ]);
    // The second SELECT's keys are written in the first one's order (SQL matches by place).
    expect(statementOf(allEvents)).toContain(
      `SELECT "app_events"."id" AS "id", "app_events"."user_id" AS "userId", "app_events"."kind" AS "kind", 'app' AS "src"`,
    );
  });

  it("names a subquery's and every SELECT's columns by drizzle's casing", () => {
    const people = pgTable('people', { personId: integer().primaryKey(), teamId: integer() });
    const teams = pgTable('teams', { teamId: integer().primaryKey(), teamName: text() });
    const build = (casing?: 'snake_case') =>
      transform(
        'staffed_teams',
        (t) =>
          t
            .from(teams)
            .select({ teamId: teams.teamId })
            .where(
              inArray(
                teams.teamId,
                subquery((s) => s.from(people).select({ teamId: people.teamId })),
              ),
            )
            .unionAll(t.from(people).select({ teamId: people.personId })),
        casing ? { casing } : {},
      );
    const snake = statementOf(build('snake_case'));
    expect(snake).toContain(
      '"teams"."team_id" in (SELECT "people"."team_id" AS "team_id" FROM "people")',
    );
    expect(snake).toContain('SELECT "people"."person_id" AS "team_id"');
    // With no casing named, trellis generate transform --from renders it with the config's.
    expect(transformDefinition(build()).withCasing?.('snake_case').statement).toBe(snake);
  });

  it('refuses what it cannot write, with validation', () => {
    const refusals = [
      // drizzle's own select: its tables unchecked, written by another dialect.
      () =>
        transform('x', (t) =>
          t
            .from(vCustomers)
            .select({ id: vCustomers.id })
            .where(exists(new QueryBuilder().select().from(vOrders))),
        ),
      // A column of neither the subquery's tables nor the statement's.
      () =>
        transform('x', (t) =>
          t
            .from(vCustomers)
            .select({ id: vCustomers.id })
            .where(
              exists(
                subquery((s) =>
                  s.from(vOrders).select({ id: vOrders.id }).where(eq(vBlocked.id, 1)),
                ),
              ),
            ),
        ),
      () =>
        transform('x', (t) =>
          t
            .from(vOrders)
            .select({ id: vOrders.id })
            .distinctOn([vOrders.customerId])
            .unionAll(t.from(vBlocked).select({ id: vBlocked.id })),
        ),
      () =>
        transform('x', (t) =>
          t
            .from(vOrders)
            .select({ id: vOrders.id })
            .topN({ partitionBy: [vOrders.customerId], orderBy: [vOrders.id], limit: 0 }),
        ),
      // A subquery outside a transform.
      () => subquery((s) => s.from(vOrders).select({ id: vOrders.id })).getSQL(),
    ];
    for (const refuse of refusals) {
      expect(refuse).toThrow(expect.objectContaining({ code: 'validation' }));
    }
    // A set operation whose SELECTs differ at run time (a cast past the types).
    expect(() =>
      transform('x', (t) =>
        t
          .from(webEvents)
          .select({ id: webEvents.id })
          .unionAll(t.from(vOrders).select({ other: vOrders.id }) as never),
      ),
    ).toThrow(/select the same keys/);
    expect(() =>
      statementOf(
        transform('x', (t) =>
          t
            .from(vCustomers)
            .select({ id: vCustomers.id })
            .where(
              sql`${vCustomers.id} > ${subquery((s) => s.from(vOrders).select({ n: sql`count(*)` }))}`,
            ),
        ),
      ),
    ).not.toThrow();
  });
});

describe('view SQL through the builder, live', () => {
  const live = livePipeline({ setup: (db) => db.sql.unsafe(TABLES).then(() => undefined) });

  it('converges to the SQL a user would write, through writes to every source', async () => {
    const { db, trellis } = live;
    await db.sql.unsafe(`
      INSERT INTO v_customers VALUES (1, 'Ada', 'north'), (2, 'Bo', NULL), (3, 'Cy', 'south'),
        (4, 'Di', 'north'), (5, 'Ed', NULL);
      INSERT INTO v_orders VALUES (1, 1, 10, 'paid'), (2, 1, 10, 'paid'), (3, 1, 4, 'open'),
        (4, 2, 7, 'paid'), (5, 3, 1, 'paid'), (6, 3, 30, 'open'), (7, 4, 5, 'open');
      INSERT INTO v_blocked VALUES (1, 3), (2, 9);
      INSERT INTO web_events VALUES (1, 1, 'view'), (2, 2, 'click'), (3, 3, 'view');
      INSERT INTO app_events VALUES (1, 1, 'open'), (2, 4, NULL), (3, 0, 'x');
    `);
    for (const target of TARGETS) await trellis.apply(statementOf(target));
    await live.converged(DEFINITIONS);
    await live.steps(DEFINITIONS, [
      // Inserts, duplicates across the union, a NULL into NOT IN's subquery.
      `INSERT INTO v_orders VALUES (8, 5, 2, 'paid'), (9, 4, 10, 'paid');
       INSERT INTO web_events VALUES (4, 4, 'open');
       INSERT INTO app_events VALUES (4, 1, 'open');
       INSERT INTO v_blocked VALUES (3, NULL);`,
      // Join and correlation columns changed, keys changed, a tie made and broken.
      `UPDATE v_orders SET customer_id = 2 WHERE id = 1;
       UPDATE v_orders SET status = 'paid', amount = 10 WHERE id = 3;
       UPDATE v_customers SET region = 'north' WHERE id = 2;
       UPDATE v_orders SET id = 20 WHERE id = 5;
       UPDATE app_events SET user_id = 3, kind = NULL WHERE id = 4;`,
      // Deletes: the NULL goes, a customer's last order goes, a blocked user goes.
      `DELETE FROM v_blocked WHERE customer_id IS NULL OR id = 1;
       DELETE FROM v_orders WHERE customer_id = 4;
       DELETE FROM web_events WHERE id = 3;
       DELETE FROM v_customers WHERE id = 5;`,
    ]);
    // Read back typed through drizzle: the select keys, decoded as the sources' columns.
    const client = sqlClient(db.url, { max: 1 });
    onTestFinished(() => client.end());
    const orm = drizzle({ client });
    const rows = await orm.select().from(allEvents).orderBy(allEvents.src, allEvents.id);
    const expected = await db.sql.unsafe(
      `SELECT id, user_id AS "userId", kind, 'web' AS src FROM web_events
       UNION ALL SELECT id, user_id, kind, 'app' FROM app_events WHERE user_id > 0 ORDER BY 4, 1`,
    );
    expect(rows).toEqual([...expected]);
    expect(rows.some((r) => r.kind === null)).toBe(true);
  });
});
