// The shop's HTTP API on Hono: endpoints that write orders, reports read from Trellis
// targets with typed drizzle queries, /metrics, and the operations page at /ops/.
import type { HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { and, asc, desc, eq, inArray } from 'drizzle-orm';
import type { PostgresJsDatabase } from 'drizzle-orm/postgres-js';
import { Hono } from 'hono';
import { HTTPException } from 'hono/http-exception';
import { isTrellisError, prometheusContentType, renderPrometheus, type Trellis } from 'trellis-pg';
import { type OpsAuthorize, opsHandler } from 'trellis-pg/ops';
import {
  customerRevenue,
  customers,
  openOrders,
  orderLines,
  orders,
  productSales,
  products,
} from './db/schema.js';

export interface ShopOptions {
  db: PostgresJsDatabase;
  trellis: Trellis;
  /** Who may pause, resume, release and check from the operations page (read-only without). */
  authorizeOps?: OpsAuthorize;
}

interface NewOrder {
  customerId: number;
  lines: { productId: number; quantity: number }[];
}

function badRequest(message: string): never {
  throw new HTTPException(400, { message });
}

function positiveInt(value: unknown, what: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value <= 0) {
    badRequest(`${what} must be a positive integer`);
  }
  return value;
}

function parseOrder(body: unknown): NewOrder {
  const b = (body ?? {}) as Partial<NewOrder>;
  if (!Array.isArray(b.lines) || b.lines.length === 0) badRequest('an order needs lines');
  return {
    customerId: positiveInt(b.customerId, 'customerId'),
    lines: b.lines.map((l) => ({
      productId: positiveInt(l?.productId, 'productId'),
      quantity: positiveInt(l?.quantity, 'quantity'),
    })),
  };
}

/** Rows a report returns at most in one page, unless `?limit` asks for fewer. */
const PAGE_MAX = 500;
const PAGE_DEFAULT = 50;

/** A report's page from `?limit` (1-500, 50 by default) and `?offset` (0 by default). */
function pageOf(query: (name: string) => string | undefined): { limit: number; offset: number } {
  const number = (name: string, fallback: number, min: number, max: number) => {
    const text = query(name);
    if (text === undefined) return fallback;
    const n = Number(text);
    if (!/^\d+$/.test(text) || n < min || n > max) {
      badRequest(`${name} must be an integer from ${min} to ${max}`);
    }
    return n;
  };
  return {
    limit: number('limit', PAGE_DEFAULT, 1, PAGE_MAX),
    offset: number('offset', 0, 0, Number.MAX_SAFE_INTEGER),
  };
}

/**
 * Names the next page in a `Link: <…>; rel="next"` header while this one is full (the next
 * may hold more rows); the body stays the array of rows it was before paging.
 */
function linkNext(
  c: { req: { url: string }; header: (name: string, value: string) => void },
  rows: number,
  { limit, offset }: { limit: number; offset: number },
): void {
  if (rows < limit) return;
  const next = new URL(c.req.url);
  next.searchParams.set('limit', String(limit));
  next.searchParams.set('offset', String(offset + limit));
  // Later pages are read as the workers have made them: ?fresh waited once already.
  next.searchParams.delete('fresh');
  c.header('link', `<${next.pathname}${next.search}>; rel="next"`);
}

const NEXT_STATUS = { pay: 'paid', ship: 'shipped', cancel: 'cancelled' } as const;
/** Which statuses each step may leave. */
const FROM_STATUS = { pay: ['open'], ship: ['paid'], cancel: ['open', 'paid'] } as const;

export function createApp({ db, trellis, authorizeOps }: ShopOptions) {
  const app = new Hono<{ Bindings: HttpBindings }>();
  const ops = opsHandler({ trellis, title: 'Shop · Trellis operations', authorize: authorizeOps });

  /**
   * `?fresh` makes a report wait until every write committed before the request is in it
   * (read-your-writes); without it a report is as fresh as the workers have made it.
   */
  async function settle(target: string, fresh: string | undefined): Promise<void> {
    if (fresh === undefined) return;
    await trellis.awaitConverged(target, await trellis.watermarkToken(), { timeoutMs: 10_000 });
  }

  app.get('/', (c) =>
    c.json({
      endpoints: [
        'POST /customers',
        'POST /products',
        'POST /orders',
        'POST /orders/:id/pay | /ship | /cancel',
        'GET /reports/customer-revenue',
        'GET /reports/product-sales',
        'GET /reports/open-orders',
        'GET /metrics',
        'GET /ops/',
      ],
    }),
  );

  app.post('/customers', async (c) => {
    const b = await c.req.json<{ name?: string; email?: string; country?: string }>();
    if (!b.name || !b.email || !b.country) badRequest('name, email and country are required');
    const [row] = await db
      .insert(customers)
      .values({ name: b.name, email: b.email, country: b.country })
      .returning();
    return c.json(row, 201);
  });

  app.post('/products', async (c) => {
    const b = await c.req.json<{ name?: string; category?: string; price?: string }>();
    if (!b.name || !b.category || !/^\d+(\.\d{1,2})?$/.test(b.price ?? '')) {
      badRequest('name, category and price (e.g. "9.90") are required');
    }
    const [row] = await db
      .insert(products)
      .values({ name: b.name, category: b.category, price: b.price! })
      .returning();
    return c.json(row, 201);
  });

  // An order and its lines in one transaction, each line at the product's current price.
  app.post('/orders', async (c) => {
    const order = parseOrder(await c.req.json());
    const created = await db.transaction(async (tx) => {
      const ids = [...new Set(order.lines.map((l) => l.productId))];
      const prices = await tx
        .select({ id: products.id, price: products.price })
        .from(products)
        .where(inArray(products.id, ids));
      const priceOf = new Map(prices.map((p) => [p.id, p.price]));
      for (const id of ids) if (!priceOf.has(id)) badRequest(`there is no product ${id}`);
      const [row] = await tx
        .insert(orders)
        .values({ customerId: order.customerId })
        .returning({ id: orders.id });
      await tx.insert(orderLines).values(
        order.lines.map((l) => ({
          orderId: row!.id,
          productId: l.productId,
          quantity: l.quantity,
          unitPrice: priceOf.get(l.productId)!,
        })),
      );
      return row!;
    });
    return c.json(created, 201);
  });

  app.post('/orders/:id/:step{pay|ship|cancel}', async (c) => {
    const id = Number(c.req.param('id'));
    const step = c.req.param('step') as keyof typeof NEXT_STATUS;
    const [row] = await db
      .update(orders)
      .set({ status: NEXT_STATUS[step] })
      .where(and(eq(orders.id, id), inArray(orders.status, [...FROM_STATUS[step]])))
      .returning({ id: orders.id, status: orders.status });
    if (row) return c.json(row);
    const [existing] = await db
      .select({ status: orders.status })
      .from(orders)
      .where(eq(orders.id, id));
    if (!existing) throw new HTTPException(404, { message: `there is no order ${id}` });
    throw new HTTPException(409, { message: `order ${id} is ${existing.status}: cannot ${step}` });
  });

  // Reports come in pages (?limit, ?offset; a Link header names the next), each ordered
  // by the report's key last, so that pages neither repeat nor skip a row.
  app.get('/reports/customer-revenue', async (c) => {
    const page = pageOf((n) => c.req.query(n));
    await settle('customer_revenue', c.req.query('fresh'));
    // Typed by the transform's SELECT: { customerId: number; revenue: string; orders: number }[]
    const rows = await db
      .select()
      .from(customerRevenue)
      .orderBy(desc(customerRevenue.revenue), asc(customerRevenue.customerId))
      .limit(page.limit)
      .offset(page.offset);
    linkNext(c, rows.length, page);
    return c.json(rows);
  });

  app.get('/reports/product-sales', async (c) => {
    const page = pageOf((n) => c.req.query(n));
    await settle('product_sales', c.req.query('fresh'));
    const rows = await db
      .select()
      .from(productSales)
      .orderBy(desc(productSales.unitsSold), asc(productSales.productId))
      .limit(page.limit)
      .offset(page.offset);
    linkNext(c, rows.length, page);
    return c.json(rows);
  });

  app.get('/reports/open-orders', async (c) => {
    const page = pageOf((n) => c.req.query(n));
    await settle('open_orders', c.req.query('fresh'));
    const rows = await db
      .select({ id: openOrders.id, customerId: openOrders.customerId, name: customers.name })
      .from(openOrders)
      .innerJoin(customers, eq(customers.id, openOrders.customerId))
      .orderBy(asc(openOrders.placedAt), asc(openOrders.id))
      .limit(page.limit)
      .offset(page.offset);
    linkNext(c, rows.length, page);
    return c.json(rows);
  });

  app.get('/metrics', async (c) =>
    c.body(await renderPrometheus(), 200, { 'content-type': prometheusContentType }),
  );

  // The operations page is a node:http handler: give it Node's request and response.
  app.all('/ops', (c) => c.redirect('/ops/'));
  app.all('/ops/*', (c) => {
    ops(c.env.incoming, c.env.outgoing);
    return RESPONSE_ALREADY_SENT;
  });

  app.onError((error, c) => {
    if (error instanceof HTTPException) return c.json({ error: error.message }, error.status);
    if (isTrellisError(error) && error.code === 'timeout') {
      return c.json({ error: 'the report is still catching up; try again' }, 503);
    }
    // awaitConverged on a paused transform fails at once: the report is stopped, not slow.
    if (isTrellisError(error) && error.code === 'conflict') {
      return c.json({ error: `the report is paused: ${error.message}` }, 503);
    }
    // A reference to a row that does not exist (an unknown customer or product): the
    // request's fault, said as the database's constraint says it.
    const pg = foreignKeyViolation(error);
    if (pg) return c.json({ error: pg }, 422);
    console.error(error);
    return c.json({ error: 'internal error' }, 500);
  });

  return app;
}

/** The detail of a foreign-key violation (SQLSTATE 23503), drizzle's wrapper looked through. */
function foreignKeyViolation(error: unknown): string | undefined {
  for (let e: unknown = error; e instanceof Error; e = e.cause) {
    const pg = e as Error & { code?: unknown; detail?: unknown };
    if (pg.code === '23503') return typeof pg.detail === 'string' ? pg.detail : pg.message;
  }
  return undefined;
}
