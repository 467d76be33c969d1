// The builder's view SQL (ADR 0078) in types: the rows its targets infer, and wrong columns
// refused. `npm run typecheck` checks this file (it is never run): each `@ts-expect-error`
// line must fail to compile, or the check fails.
import { desc, eq, exists, sql } from 'drizzle-orm';
import { expectTypeOf } from 'vitest';
import { subquery, transform } from '../../src/drizzle/index.js';
import {
  type activeUsers,
  type allEvents,
  appEvents,
  type customerSpend,
  type largestOrder,
  type orderCounts,
  perCustomer,
  type topRegionOrders,
  vBlocked,
  vCustomers,
  vOrders,
  webEvents,
} from '../support/drizzle-view-sql.js';

// A set operation's column is nullable when it is in any SELECT (app_events.kind).
expectTypeOf<(typeof allEvents)['$inferSelect']>().toEqualTypeOf<{
  id: number;
  userId: number;
  kind: string | null;
  src: string;
}>();
expectTypeOf<(typeof activeUsers)['$inferSelect']>().toEqualTypeOf<{ userId: number }>();
expectTypeOf<(typeof largestOrder)['$inferSelect']>().toEqualTypeOf<{
  customerId: number;
  id: number;
  amount: string;
}>();
expectTypeOf<(typeof topRegionOrders)['$inferSelect']>().toEqualTypeOf<{
  id: number;
  buyerName: string;
  amount: string;
}>();

// A subquery's SELECT takes columns of its own tables only.
subquery((s) =>
  // @ts-expect-error v_blocked is not a table of the subquery
  s.from(vOrders).select({ id: vBlocked.id }),
);
transform('ok_exists', (t) =>
  t
    .from(vCustomers)
    .select({ id: vCustomers.id })
    .where(
      exists(
        subquery((s) =>
          s.from(vOrders).select({ id: vOrders.id }).where(eq(vOrders.customerId, vCustomers.id)),
        ),
      ),
    ),
);

// The SELECTs of a set operation have the same keys, of the same types.
transform('bad_union_keys', (t) =>
  t
    .from(webEvents)
    .select({ id: webEvents.id, userId: webEvents.userId })
    // @ts-expect-error a key the first SELECT lacks
    .unionAll(t.from(appEvents).select({ id: appEvents.id, user: appEvents.userId })),
);
transform('bad_union_missing', (t) =>
  t
    .from(webEvents)
    .select({ id: webEvents.id, userId: webEvents.userId })
    // @ts-expect-error a key missing
    .union(t.from(appEvents).select({ id: appEvents.id })),
);
transform('bad_union_types', (t) =>
  t
    .from(webEvents)
    .select({ id: webEvents.id, kind: webEvents.kind })
    // @ts-expect-error kind is text in one SELECT, an integer in the other
    .unionAll(t.from(appEvents).select({ id: appEvents.id, kind: appEvents.userId })),
);
transform('bad_union_chained', (t) =>
  t
    .from(webEvents)
    .select({ id: webEvents.id })
    .union(t.from(appEvents).select({ id: appEvents.id }))
    // @ts-expect-error the third SELECT is checked against the first two
    .except(t.from(vBlocked).select({ id: sql<string>`'x'` })),
);
transform('bad_union_column', (t) =>
  t
    .from(webEvents)
    .select({ id: webEvents.id })
    // @ts-expect-error web_events is not a table of the second SELECT
    .unionAll(t.from(appEvents).select({ id: webEvents.id })),
);

// DISTINCT ON and top-N take columns of the statement's tables.
transform('bad_distinct_on', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id })
    // @ts-expect-error v_customers is not a table of the statement
    .distinctOn([vCustomers.id], [desc(vOrders.id)]),
);
transform('bad_top_n', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id })
    // @ts-expect-error v_blocked is not a table of the statement
    .topN({ partitionBy: [vBlocked.customerId], orderBy: [vOrders.id], limit: 3 }),
);
transform('bad_top_n_rank', (t) =>
  t
    .from(vOrders)
    .select({ id: vOrders.id })
    // @ts-expect-error lag() is not a ranking function
    .topN({ partitionBy: [vOrders.customerId], orderBy: [vOrders.id], limit: 3, rank: 'lag' }),
);

// A derived table's columns are typed as a target's, and belong to its alias.
expectTypeOf<(typeof customerSpend)['$inferSelect']>().toEqualTypeOf<{
  id: number;
  name: string;
  total: string;
}>();
expectTypeOf<(typeof orderCounts)['$inferSelect']>().toEqualTypeOf<{
  n: number;
  customers: number;
}>();
transform('bad_derived', (t) =>
  // @ts-expect-error per_customer is not a table of this statement
  t.from(vOrders).select({ total: perCustomer.total }),
);
transform('bad_derived_key', (t) =>
  // @ts-expect-error a misspelt column of the derived table
  t.from(perCustomer).select({ total: perCustomer.totl }),
);
