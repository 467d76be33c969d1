// The app's drizzle schema and the transforms built from it, for
// test/drizzle-builder.test.ts (which runs them) and test/types/drizzle-builder.types.ts
// (which tsc checks for the row types they infer).
import { and, asc, eq, gt, ne, sql } from 'drizzle-orm';
import {
  alias,
  bigint,
  boolean,
  integer,
  numeric,
  pgTable,
  text,
  timestamp,
} from 'drizzle-orm/pg-core';
import type { drizzle } from 'drizzle-orm/postgres-js';
import { transform } from '../../src/drizzle/index.js';

// The app's drizzle schema. Tables are created below with the DDL drizzle-kit writes for them.
export const customers = pgTable('customers', {
  id: integer().primaryKey(),
  name: text().notNull(),
  region: text(),
});
export const orders = pgTable('orders', {
  id: integer().primaryKey(),
  customerId: integer('customer_id').notNull(),
  amount: numeric().notNull(),
  status: text().notNull(),
  placedAt: timestamp('placed_at', { withTimezone: true }).notNull(),
  gift: boolean().notNull().default(false),
  serial: bigint({ mode: 'bigint' }),
});
// Declared without column names, for an app that uses drizzle's casing: 'snake_case'.
export const employees = pgTable('employees', {
  id: integer().primaryKey(),
  fullName: text().notNull(),
  managerId: integer(),
});

// A status that needs quoting, and a comment marker: a value must stay a value.
export const PAID = "paid'); DROP TABLE orders; --";
export const SINCE = new Date('2024-03-01T00:00:00Z');

export const customerTotals = transform('customer_totals', (t) =>
  t
    .from(orders)
    .innerJoin(customers, eq(orders.customerId, customers.id))
    .select({
      customerId: orders.customerId,
      name: customers.name,
      region: sql<string | null>`max(${customers.region})`,
      total: sql<string>`sum(${orders.amount})`,
      orderCount: sql<number>`count(*)`.mapWith(Number),
      lastPlaced: sql<Date>`max(${orders.placedAt})`.mapWith(orders.placedAt),
    })
    .where(and(eq(orders.status, PAID), gt(orders.placedAt, SINCE), eq(orders.gift, false)))
    .groupBy(orders.customerId, customers.name)
    .having(sql`count(*) >= ${2}`),
);

export const manager = alias(employees, 'manager');
export const reportingLines = transform(
  'reporting_lines',
  (t) =>
    t
      .from(employees)
      .leftJoin(manager, eq(manager.id, employees.managerId))
      .select({
        employeeId: employees.id,
        fullName: employees.fullName,
        managerName: manager.fullName,
      })
      .where(ne(employees.fullName, '')),
  { casing: 'snake_case' },
);
// A chain: a transform over another transform's target.
export const bigCustomers = transform('big_customers', (t) =>
  t
    .from(customerTotals)
    .select({ customerId: customerTotals.customerId, total: customerTotals.total })
    .where(gt(customerTotals.orderCount, 2)),
);
export type Db = ReturnType<typeof drizzle>;
export function readTotals(db: Db) {
  return db.select().from(customerTotals).orderBy(asc(customerTotals.customerId));
}
