// The shop's tables, and the reports Trellis keeps up to date from them. drizzle-kit
// generates the tables' migrations from this file; `trellis generate transform --from`
// generates the transforms' migrations from the same file.
import { eq, inArray, sql } from 'drizzle-orm';
import { index, integer, numeric, pgTable, serial, text, timestamp } from 'drizzle-orm/pg-core';
import { transform } from 'trellis-pg/drizzle';

export const customers = pgTable('customers', {
  id: serial().primaryKey(),
  name: text().notNull(),
  email: text().notNull().unique(),
  country: text().notNull(),
});

export const products = pgTable('products', {
  id: serial().primaryKey(),
  name: text().notNull(),
  category: text().notNull(),
  price: numeric({ precision: 10, scale: 2 }).notNull(),
});

export const orders = pgTable(
  'orders',
  {
    id: serial().primaryKey(),
    customerId: integer('customer_id')
      .notNull()
      .references(() => customers.id),
    /** open → paid → shipped, or cancelled. */
    status: text().notNull().default('open'),
    placedAt: timestamp('placed_at', { withTimezone: true }).notNull().defaultNow(),
  },
  // Trellis routes a changed order to its customer's group through customer_id: without an
  // index each change would scan the table (status() reports such gaps as sourceIndexGaps).
  (t) => [index('orders_customer_id_idx').on(t.customerId)],
);

export const orderLines = pgTable(
  'order_lines',
  {
    id: serial().primaryKey(),
    orderId: integer('order_id')
      .notNull()
      .references(() => orders.id),
    productId: integer('product_id')
      .notNull()
      .references(() => products.id),
    quantity: integer().notNull(),
    /** The price paid, copied from the product when the order was placed. */
    unitPrice: numeric('unit_price', { precision: 10, scale: 2 }).notNull(),
  },
  (t) => [
    index('order_lines_order_id_idx').on(t.orderId),
    index('order_lines_product_id_idx').on(t.productId),
  ],
);

/**
 * What each customer has spent on orders shipped to them, and when they last ordered
 * (GROUP BY over a join). Changed after it was first defined (paid or shipped orders, no
 * lastOrderAt): drizzle/0010_trellis_redefine_customer_revenue.sql redefines it in place.
 */
export const customerRevenue = transform('customer_revenue', (t) =>
  t
    .from(orderLines)
    .innerJoin(orders, eq(orderLines.orderId, orders.id))
    .select({
      customerId: orders.customerId,
      revenue: sql<string>`sum(${orderLines.quantity} * ${orderLines.unitPrice})`,
      orders: sql<number>`count(DISTINCT ${orders.id})`.mapWith(Number),
      lastOrderAt: sql<Date>`max(${orders.placedAt})`,
    })
    .where(eq(orders.status, 'shipped'))
    .groupBy(orders.customerId),
);

/** Products that sold at least 3 units, with units and revenue (JOIN, GROUP BY, HAVING). */
export const productSales = transform('product_sales', (t) =>
  t
    .from(orderLines)
    .innerJoin(products, eq(orderLines.productId, products.id))
    .innerJoin(orders, eq(orderLines.orderId, orders.id))
    .select({
      productId: products.id,
      name: products.name,
      category: products.category,
      unitsSold: sql<number>`sum(${orderLines.quantity})`.mapWith(Number),
      revenue: sql<string>`sum(${orderLines.quantity} * ${orderLines.unitPrice})`,
    })
    .where(inArray(orders.status, ['paid', 'shipped']))
    .groupBy(products.id, products.name, products.category)
    .having(sql`sum(${orderLines.quantity}) >= ${3}`),
);

/** Orders waiting to be paid, for the shop's to-do list (a filtered projection). */
export const openOrders = transform('open_orders', (t) =>
  t
    .from(orders)
    .select({ id: orders.id, customerId: orders.customerId, placedAt: orders.placedAt })
    .where(eq(orders.status, 'open')),
);
