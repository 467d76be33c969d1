// View SQL through the drizzle builder (issue #26, ADR 0078): subqueries in WHERE, set
// operations, DISTINCT ON and top-N, for test/drizzle-view-sql.test.ts (which runs them)
// and test/types/drizzle-view-sql.types.ts (which tsc checks, wrong columns included).
import { and, desc, eq, exists, gt, inArray, notExists, notInArray, sql } from 'drizzle-orm';
import { alias, integer, numeric, pgTable, text } from 'drizzle-orm/pg-core';
import { derived, subquery, transform } from '../../src/drizzle/index.js';

export const vCustomers = pgTable('v_customers', {
  id: integer().primaryKey(),
  name: text().notNull(),
  region: text(),
});
export const vOrders = pgTable('v_orders', {
  id: integer().primaryKey(),
  customerId: integer('customer_id').notNull(),
  amount: numeric().notNull(),
  status: text().notNull(),
});
export const vBlocked = pgTable('v_blocked', {
  id: integer().primaryKey(),
  customerId: integer('customer_id'),
});
export const webEvents = pgTable('web_events', {
  id: integer().primaryKey(),
  userId: integer('user_id').notNull(),
  kind: text().notNull(),
});
export const appEvents = pgTable('app_events', {
  id: integer().primaryKey(),
  userId: integer('user_id').notNull(),
  kind: text(),
});

export const TABLES = `
  CREATE TABLE v_customers (id integer PRIMARY KEY, name text NOT NULL, region text);
  CREATE TABLE v_orders (id integer PRIMARY KEY, customer_id integer NOT NULL,
    amount numeric NOT NULL, status text NOT NULL);
  CREATE INDEX ON v_orders (customer_id);
  CREATE TABLE v_blocked (id integer PRIMARY KEY, customer_id integer);
  CREATE INDEX ON v_blocked (customer_id);
  CREATE TABLE web_events (id integer PRIMARY KEY, user_id integer NOT NULL, kind text NOT NULL);
  CREATE TABLE app_events (id integer PRIMARY KEY, user_id integer NOT NULL, kind text);
`;

// EXISTS, correlated: customers with a paid order.
export const payingCustomers = transform('paying_customers', (t) =>
  t
    .from(vCustomers)
    .select({ id: vCustomers.id, name: vCustomers.name })
    .where(
      exists(
        subquery((s) =>
          s
            .from(vOrders)
            .select({ one: sql<number>`1` })
            .where(and(eq(vOrders.customerId, vCustomers.id), eq(vOrders.status, 'paid'))),
        ),
      ),
    ),
);

// NOT EXISTS: customers with no order at all.
export const idleCustomers = transform('idle_customers', (t) =>
  t
    .from(vCustomers)
    .select({ id: vCustomers.id, region: vCustomers.region })
    .where(
      notExists(
        subquery((s) =>
          s.from(vOrders).select({ id: vOrders.id }).where(eq(vOrders.customerId, vCustomers.id)),
        ),
      ),
    ),
);

// IN (SELECT …), over a target (a chain): orders of the paying customers of the north.
export const northOrders = transform('north_orders', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id, amount: vOrders.amount })
    .where(
      inArray(
        vOrders.customerId,
        subquery((s) =>
          s
            .from(payingCustomers)
            .innerJoin(vCustomers, eq(vCustomers.id, payingCustomers.id))
            .select({ id: payingCustomers.id })
            .where(eq(vCustomers.region, 'north')),
        ),
      ),
    ),
);

// NOT IN over a nullable column: SQL's NULL semantics, exactly.
export const unblockedOrders = transform('unblocked_orders', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id, customerId: vOrders.customerId })
    .where(
      and(
        gt(vOrders.amount, '1'),
        notInArray(
          vOrders.customerId,
          subquery((s) => s.from(vBlocked).select({ customerId: vBlocked.customerId })),
        ),
      ),
    ),
);

// UNION ALL: the two event tables as one (keys in another order: written in the first's).
export const allEvents = transform('all_events', (t) =>
  t
    .from(webEvents)
    .select({
      id: webEvents.id,
      userId: webEvents.userId,
      kind: webEvents.kind,
      src: sql<string>`'web'`,
    })
    .unionAll(
      t
        .from(appEvents)
        .select({
          userId: appEvents.userId,
          id: appEvents.id,
          kind: appEvents.kind,
          src: sql<string>`'app'`,
        })
        .where(gt(appEvents.userId, 0)),
    ),
);

// UNION, then EXCEPT: users seen anywhere but not blocked.
export const activeUsers = transform('active_users', (t) =>
  t
    .from(webEvents)
    .select({ userId: webEvents.userId })
    .union(t.from(appEvents).select({ userId: appEvents.userId }))
    .except(
      t
        .from(vBlocked)
        .select({ userId: sql<number>`${vBlocked.customerId}` })
        .where(sql`${vBlocked.customerId} IS NOT NULL`),
    ),
);

// DISTINCT ON: each customer's largest order (ties by id, the latest).
export const largestOrder = transform('largest_order', (t) =>
  t
    .from(vOrders)
    .select({ customerId: vOrders.customerId, id: vOrders.id, amount: vOrders.amount })
    .where(eq(vOrders.status, 'paid'))
    .distinctOn([vOrders.customerId], [desc(vOrders.amount), desc(vOrders.id)]),
);

// Top-N per group: each buyer name's two largest orders, by rank (ties kept).
export const buyer = alias(vCustomers, 'buyer');
export const topRegionOrders = transform('top_region_orders', (t) =>
  t
    .from(vOrders)
    .innerJoin(buyer, eq(buyer.id, vOrders.customerId))
    .select({ id: vOrders.id, buyerName: buyer.name, amount: vOrders.amount })
    .topN({ partitionBy: [buyer.name], orderBy: [desc(vOrders.amount)], limit: 2, rank: 'rank' }),
);

// Top-N with row_number: each customer's first two orders by id.
export const firstOrders = transform('first_orders', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id, customerId: vOrders.customerId, status: vOrders.status })
    .topN({ partitionBy: [vOrders.customerId], orderBy: [vOrders.id], limit: 2 }),
);

// A scalar subquery in a sql template: orders above the average paid amount.
export const bigOrders = transform('big_orders', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id, amount: vOrders.amount })
    .where(
      sql`${vOrders.amount} > ${subquery((s) =>
        s
          .from(vOrders)
          .select({ avg: sql<string>`avg(${vOrders.amount})` })
          .where(eq(vOrders.status, 'paid')),
      )}`,
    ),
);

// INTERSECT after UNION: what came before is bracketed (INTERSECT binds tighter in SQL).
export const buyingUsers = transform('buying_users', (t) =>
  t
    .from(webEvents)
    .select({ userId: webEvents.userId })
    .union(t.from(appEvents).select({ userId: appEvents.userId }))
    .intersect(t.from(vOrders).select({ userId: vOrders.customerId })),
);

// A derived table (a subquery in FROM): each customer's total and count of orders.
export const perCustomer = derived('per_customer', (s) =>
  s
    .from(vOrders)
    .select({
      customerId: vOrders.customerId,
      total: sql<string>`sum(${vOrders.amount})`,
      n: sql<number>`count(*)`.mapWith(Number),
    })
    .groupBy(vOrders.customerId),
);
export const customerSpend = transform('customer_spend', (t) =>
  t
    .from(vCustomers)
    .innerJoin(perCustomer, eq(perCustomer.customerId, vCustomers.id))
    .select({ id: vCustomers.id, name: vCustomers.name, total: perCustomer.total })
    .where(gt(perCustomer.n, 1)),
);
// An aggregate over an aggregate: how many customers have each number of orders.
export const orderCounts = transform('order_counts', (t) =>
  t
    .from(perCustomer)
    .select({ n: perCustomer.n, customers: sql<number>`count(*)`.mapWith(Number) })
    .groupBy(perCustomer.n),
);
