import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type Definition, definitionQuery, expectMatchesDefinition } from './support/oracle.js';
import { parseScrape } from './support/prometheus.js';
import {
  assertBuilt,
  migrateShop,
  type ShopProcess,
  startShopServer,
  startShopWorker,
} from './support/shop.js';
import { waitFor } from './support/trellis.js';

// The shop example as a newcomer runs it: drizzle-kit migrate (which installs Trellis and
// defines the transforms), the worker and the server as processes of their own, then
// orders placed, paid, shipped and cancelled through its HTTP API. Each report must equal
// its transform's definition, written here as the plain SQL a user would run.

// customer_revenue as drizzle/0010_trellis_redefine_customer_revenue.sql redefines it
// (`ALTER TRANSFORM … AS`, written by `trellis generate transform`; 0002 defined it over
// paid or shipped orders, without lastOrderAt).
const revenue: Definition = {
  target: 'customer_revenue',
  from: 'order_lines JOIN orders ON order_lines.order_id = orders.id',
  select:
    'orders.customer_id AS "customerId", sum(order_lines.quantity * order_lines.unit_price) AS revenue, count(DISTINCT orders.id) AS orders, max(orders.placed_at) AS "lastOrderAt"',
  where: "orders.status = 'shipped'",
  groupBy: 'orders.customer_id',
};

const productSales: Definition = {
  target: 'product_sales',
  from: 'order_lines JOIN products ON order_lines.product_id = products.id JOIN orders ON order_lines.order_id = orders.id',
  select:
    'products.id AS "productId", products.name, products.category, sum(order_lines.quantity) AS "unitsSold", sum(order_lines.quantity * order_lines.unit_price) AS revenue',
  where: "orders.status IN ('paid', 'shipped')",
  groupBy: 'products.id, products.name, products.category',
  having: 'sum(order_lines.quantity) >= 3',
};

const openOrders: Definition = {
  target: 'open_orders',
  from: 'orders',
  select: 'id, customer_id AS "customerId", placed_at AS "placedAt"',
  where: "status = 'open'",
};

let db: TestDatabase;
let server: ShopProcess & { baseUrl: string };
let worker: ShopProcess & { metricsUrl: string };

async function call(method: string, path: string, body?: unknown): Promise<Response> {
  return fetch(`${server.baseUrl}${path}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? null : JSON.stringify(body),
  });
}

async function json<T>(method: string, path: string, body?: unknown, status = 200): Promise<T> {
  const res = await call(method, path, body);
  const text = await res.text();
  expect(res.status, `${method} ${path}: ${text}`).toBe(status);
  return JSON.parse(text) as T;
}

beforeAll(async () => {
  assertBuilt();
  db = await freshDatabase();
  await migrateShop(db.url);
  [worker, server] = await Promise.all([startShopWorker(db.url), startShopServer(db.url)]);
}, 120_000);

afterAll(async () => {
  await Promise.all([server?.stop(), worker?.stop()]);
});

describe('the shop example', () => {
  it('switches customer_revenue to the definition its migration 0010 redefined it to', async () => {
    // The migration only starts the redefinition; the worker builds it and switches.
    let state: { state: string; previous: string; changes: string[] } | undefined;
    await waitFor(async () => {
      [state] = await db.sql<{ state: string; previous: string; changes: string[] }[]>`
        SELECT redefinition->>'state' AS state, redefinition->>'previous' AS previous,
               redefinition->'changes' AS changes
          FROM trellis.transforms WHERE target_name = 'customer_revenue' AND redefines IS NULL`;
      return state?.state === 'switched' || state?.state === 'failed';
    }, 'customer_revenue to switch to its new definition');
    expect(state!.state).toBe('switched');
    expect(state!.previous).toContain("'paid'");
    expect(state!.changes).toContain('column "lastOrderAt" added (timestamp with time zone)');
    await expectMatchesDefinition(db.sql, revenue);
  });

  it('keeps its reports equal to their definitions as orders come through the API', async () => {
    const customers: number[] = [];
    for (const [name, country] of [
      ['Ada', 'FR'],
      ['Bo', 'DE'],
      ['Cy', 'US'],
      ['Di', 'JP'],
    ] as const) {
      const c = await json<{ id: number }>(
        'POST',
        '/customers',
        { name, country, email: `${name.toLowerCase()}@example.com` },
        201,
      );
      customers.push(c.id);
    }
    const products: number[] = [];
    for (let i = 1; i <= 5; i++) {
      const p = await json<{ id: number }>(
        'POST',
        '/products',
        { name: `Item ${i}`, category: i % 2 ? 'books' : 'tools', price: `${i * 3}.50` },
        201,
      );
      products.push(p.id);
    }
    // Deterministic but varied: some orders paid, some shipped, some cancelled, some open.
    const orders: number[] = [];
    for (let i = 0; i < 24; i++) {
      const lines = [
        { productId: products[i % 5]!, quantity: 1 + (i % 3) },
        { productId: products[(i * 3 + 1) % 5]!, quantity: 1 + (i % 2) },
      ];
      const o = await json<{ id: number }>(
        'POST',
        '/orders',
        { customerId: customers[i % 4]!, lines },
        201,
      );
      orders.push(o.id);
      if (i % 4 !== 0) await json('POST', `/orders/${o.id}/pay`);
      if (i % 4 === 2) await json('POST', `/orders/${o.id}/ship`);
      if (i % 6 === 5) await json('POST', `/orders/${o.id}/cancel`);
    }
    // A step an order cannot take is refused, and a bad order never reaches the tables.
    expect((await call('POST', `/orders/${orders[0]}/ship`)).status).toBe(409);
    expect((await call('POST', '/orders', { customerId: customers[0], lines: [] })).status).toBe(
      400,
    );
    // A customer (or product) that does not exist is the request's fault: 422, saying which.
    const unknown = await call('POST', '/orders', {
      customerId: 999_999,
      lines: [{ productId: products[0]!, quantity: 1 }],
    });
    expect(unknown.status).toBe(422);
    expect(await unknown.text()).toContain('999999');

    // ?fresh waits (awaitConverged) until every write before the request is in the report.
    const revenueRows = await json<{ customerId: number; revenue: string; orders: number }[]>(
      'GET',
      '/reports/customer-revenue?fresh',
    );
    const salesRows = await json<{ productId: number; unitsSold: number }[]>(
      'GET',
      '/reports/product-sales?fresh',
    );
    const openRows = await json<{ id: number; name: string }[]>(
      'GET',
      '/reports/open-orders?fresh',
    );
    for (const d of [revenue, productSales, openOrders]) await expectMatchesDefinition(db.sql, d);

    // The API returns the target's rows, typed by drizzle (numbers stay numbers).
    const expectedRevenue = await db.sql.unsafe<{ customerId: number; revenue: string }[]>(
      `SELECT "customerId", revenue::text, orders::int FROM (${definitionQuery(revenue)}) d ORDER BY revenue DESC`,
    );
    expect(revenueRows.map((r) => r.revenue).sort()).toEqual(
      expectedRevenue.map((r) => r.revenue).sort(),
    );
    expect(revenueRows.every((r) => typeof r.orders === 'number')).toBe(true);
    expect(salesRows.length).toBeGreaterThan(0);
    expect(salesRows.every((r) => r.unitsSold >= 3)).toBe(true);
    const [open] = await db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM orders WHERE status = 'open'`;
    expect(openRows).toHaveLength(open!.n);
  });

  it('serves its reports in pages that together hold every row once, in order', async () => {
    const all = await json<{ id: number }[]>('GET', '/reports/open-orders?limit=500');
    expect(all.length).toBeGreaterThan(5);
    // Followed by the Link header, as a client would: pages of 5, the last one short.
    const seen: { id: number }[] = [];
    let next: string | null = '/reports/open-orders?limit=5&fresh';
    let pages = 0;
    while (next !== null) {
      const res = await call('GET', next);
      expect(res.status).toBe(200);
      const rows = (await res.json()) as { id: number }[];
      expect(rows.length).toBeLessThanOrEqual(5);
      seen.push(...rows);
      pages += 1;
      const link = res.headers.get('link');
      next = link === null ? null : /^<([^>]+)>; rel="next"$/.exec(link)![1]!;
      if (next !== null) expect(next).not.toContain('fresh');
    }
    expect(seen).toEqual(all);
    expect(pages).toBe(Math.floor(all.length / 5) + 1);
    // The other reports page the same way.
    const revenue = await json<{ customerId: number }[]>('GET', '/reports/customer-revenue');
    const [first, second] = await Promise.all([
      json<{ customerId: number }[]>('GET', '/reports/customer-revenue?limit=2'),
      json<{ customerId: number }[]>('GET', '/reports/customer-revenue?limit=2&offset=2'),
    ]);
    expect([...first, ...second]).toEqual(revenue.slice(0, 4));
    const sales = await json<unknown[]>('GET', '/reports/product-sales?limit=1&offset=0');
    expect(sales).toHaveLength(1);
    for (const bad of ['limit=0', 'limit=501', 'limit=x', 'offset=-1']) {
      const res = await call('GET', `/reports/open-orders?${bad}`);
      expect({ bad, status: res.status }).toEqual({ bad, status: 400 });
    }
  });

  it('serves its metrics and a read-only operations page', async () => {
    const metrics = await call('GET', '/metrics');
    expect(metrics.headers.get('content-type')).toContain('text/plain');
    const text = await metrics.text();
    expect(text).toContain(`trellis_instance="${db.name}/trellis"`);

    const page = await call('GET', '/ops/');
    expect(page.headers.get('content-type')).toContain('text/html');
    expect(page.headers.get('content-security-policy')).toContain("default-src 'none'");
    const snapshot = await json<{
      actions: string[];
      workers: { staging: boolean; drain: boolean };
      transforms: { target: string; status: { status: string } }[];
    }>('GET', '/ops/snapshot.json');
    expect(snapshot.actions).toEqual([]);
    expect(snapshot.workers).toEqual({ staging: true, drain: true });
    expect(snapshot.transforms.map((t) => [t.target, t.status.status])).toEqual([
      ['customer_revenue', 'live'],
      ['open_orders', 'live'],
      ['product_sales', 'live'],
    ]);
    // Without SHOP_OPS_ACTIONS the server's authorize refuses: nothing is paused.
    const refused = await fetch(`${server.baseUrl}/ops/actions/pause`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-trellis-ops': '1' },
      body: JSON.stringify({ target: 'open_orders' }),
    });
    expect(refused.status).toBe(403);
    const [row] = await db.sql<{ paused: boolean }[]>`
      SELECT paused_at IS NOT NULL AS paused FROM trellis.transforms WHERE target_name = 'open_orders'`;
    expect(row?.paused).toBe(false);

    // The worker process serves what the web process cannot (it runs no worker): the drain's
    // throughput, the staging leader, and its health. Under load every order so far may have
    // been folded into the targets' builds, so an order placed now is drained by the worker.
    const me = { trellis_instance: `${db.name}/trellis` };
    const scrapeWorker = async () =>
      parseScrape(await (await fetch(`${worker.metricsUrl}/metrics`)).text());
    const [someone] = await db.sql<{ id: number }[]>`SELECT id FROM customers ORDER BY id LIMIT 1`;
    const [something] = await db.sql<{ id: number }[]>`SELECT id FROM products ORDER BY id LIMIT 1`;
    await json(
      'POST',
      '/orders',
      { customerId: someone!.id, lines: [{ productId: something!.id, quantity: 1 }] },
      201,
    );
    await json('GET', '/reports/open-orders?fresh');
    await waitFor(
      async () => (await scrapeWorker()).sum('trellis_keys_rederived_total', me) > 0,
      "the worker's drain counted in its metrics",
    );
    const scraped = await scrapeWorker();
    expect(scraped.value('trellis_staging_leader', me)).toBe(1);
    expect(scraped.value('trellis_drain_loops_alive', me)).toBe(2);
    expect(scraped.sum('trellis_keys_rederived_total', me)).toBeGreaterThan(0);
    expect(text).not.toContain('trellis_keys_rederived_total{');
    const health = await fetch(`${worker.metricsUrl}/healthz`);
    expect(health.status).toBe(200);
  });

  it('shuts its worker and server down gracefully on SIGTERM', async () => {
    expect(await worker.stop()).toBe(0);
    expect(worker.output()).toContain('SIGTERM, shutting down');
    expect(await server.stop()).toBe(0);
    // Nothing of theirs is left connected.
    const [left] = await db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_stat_activity
       WHERE datname = ${db.name} AND pid <> pg_backend_pid() AND backend_type = 'client backend'
         AND application_name <> ''`;
    expect(left!.n).toBe(0);
  });
});
