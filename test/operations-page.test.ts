import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { type Browser, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IN_CI } from './support/ci.js';
import { freshDatabase, sqlClient, type TestDatabase } from './support/database.js';
import {
  assertBuilt,
  migrateShop,
  type ShopProcess,
  startShopServer,
  startShopWorker,
} from './support/shop.js';

// The operations page in a real browser (the system's headless Chromium, driven by
// playwright-core), mounted in the shop example as a person would use it: transforms going
// from backfilling to live, a pause and a resume through the page where the app's
// authorize allows them, no actions where it does not, names from the database shown as
// text. It saves a screenshot (test-output/operations-page.png); README's is the shop under
// load, taken by scripts/screenshot-operations.mjs.

const OUTPUT = resolve(import.meta.dirname, '../test-output');
/** A target and a column named to break out of HTML if anything rendered them as HTML. */
const HOSTILE_TARGET = '<img src=x onerror=alert(1)>';
const HOSTILE_COLUMN = '<script>alert(2)</script>';

/** The system Chromium (`apt-get install chromium`), or TRELLIS_CHROMIUM. */
function chromiumPath(): string | undefined {
  const candidates = [
    process.env.TRELLIS_CHROMIUM,
    '/usr/bin/chromium',
    '/usr/bin/chromium-browser',
  ];
  return candidates.find((p): p is string => p !== undefined && p !== '' && existsSync(p));
}

const executablePath = chromiumPath();
if (!executablePath && IN_CI) {
  throw new Error(
    'the operations page test needs Chromium: .ci/run installs it (apt-get install chromium)',
  );
}
if (!executablePath) {
  console.log(
    '[skip] operations page test: no Chromium (apt-get install chromium, or set TRELLIS_CHROMIUM)',
  );
}

let db: TestDatabase;
let readOnly: ShopProcess & { baseUrl: string };
let withActions: ShopProcess & { baseUrl: string };
let worker: ShopProcess | undefined;
let browser: Browser;
const dialogs: string[] = [];

async function openPage(baseUrl: string, colorScheme: 'light' | 'dark' = 'light'): Promise<Page> {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 }, colorScheme });
  page.on('dialog', (d) => {
    dialogs.push(d.message());
    void d.dismiss();
  });
  page.on('pageerror', (e) => dialogs.push(`page error: ${e.message}`));
  await page.goto(`${baseUrl}/ops/`);
  return page;
}

/** The page refreshes every second: give what it shows a few refreshes to change. */
function eventually<T>(read: () => Promise<T>, timeout = 15_000) {
  return expect.poll(read, { timeout });
}

/** The whole page as one image (a viewport as tall as the page keeps the header on top). */
async function screenshot(page: Page, file: string): Promise<void> {
  const height = Number(await page.evaluate('document.documentElement.scrollHeight'));
  await page.setViewportSize({ width: 1280, height: Math.max(600, Math.min(height, 4000)) });
  await page.screenshot({ path: join(OUTPUT, file) });
  console.log(`[operations page] screenshot: ${join(OUTPUT, file)}`);
}

/** What a chart shows, read in one go. */
interface ChartRead {
  points: number;
  /** The samples drawn, by their times (ISO, space-separated). */
  times: string;
  /** The polyline's points, "x,y x,y …". */
  drawn: string;
  /** The keys chart's points. */
  keys: number;
}

function card(page: Page, target: string) {
  return page.locator(`article[data-target="${target.replaceAll('"', '\\"')}"]`);
}

async function lifecycle(target: string): Promise<string> {
  const [row] = await db.sql<
    { status: string }[]
  >`SELECT trellis.status(${target})->>'status' AS status`;
  return row!.status;
}

beforeAll(async () => {
  if (!executablePath) return;
  assertBuilt();
  db = await freshDatabase();
  await migrateShop(db.url);
  // The servers and the browser start while the data loads.
  const starting = Promise.all([
    startShopServer(db.url),
    startShopServer(db.url, { SHOP_OPS_ACTIONS: '1' }),
    chromium.launch({ executablePath, args: ['--no-sandbox'] }),
  ]);
  // Enough rows that the backfills take a few of the page's refreshes.
  await db.sql.unsafe(`
    INSERT INTO customers (name, email, country)
      SELECT 'Customer ' || i, 'c' || i || '@example.com', (ARRAY['FR','DE','US','JP','BR'])[1 + i % 5]
        FROM generate_series(1, 2000) i;
    INSERT INTO products (name, category, price)
      SELECT 'Product ' || i, (ARRAY['books','tools','garden','toys'])[1 + i % 4], (5 + i * 0.25)::numeric(10,2)
        FROM generate_series(1, 200) i;
    INSERT INTO orders (customer_id, status)
      SELECT 1 + i % 2000, (ARRAY['open','paid','shipped','cancelled'])[1 + i % 4] FROM generate_series(1, 50000) i;
    INSERT INTO order_lines (order_id, product_id, quantity, unit_price)
      SELECT o.id, 1 + (o.id * 7 + l * 13) % 200, 1 + (o.id + l) % 3, 9.99
        FROM orders o CROSS JOIN generate_series(1, 3) l;
  `);
  // Two more, as an operator would meet them: a GROUP BY whose source lacks an index, and a
  // transform with hostile names whose one column fails (division by zero) for two keys.
  await db.sql.unsafe(
    `SELECT trellis.apply('TRANSFORM customers_by_country FROM customers SELECT country, count(*) AS customers GROUP BY country')`,
  );
  await db.sql`SELECT trellis.apply(${`TRANSFORM "${HOSTILE_TARGET}" FROM customers SELECT name AS "${HOSTILE_COLUMN}", 1000 / (id % 700) AS ratio`})`;
  [readOnly, withActions, browser] = await starting;
  await mkdir(OUTPUT, { recursive: true });
}, 180_000);

afterAll(async () => {
  await browser?.close();
  await Promise.all([readOnly?.stop(), withActions?.stop(), worker?.stop()]);
});

describe.skipIf(!executablePath)('the operations page, in Chromium', () => {
  let viewer: Page;

  it('shows transforms go from backfilling to live, read-only without authorize', async () => {
    viewer = await openPage(readOnly.baseUrl);
    await eventually(() => card(viewer, 'customer_revenue').getAttribute('data-lifecycle')).toBe(
      'waiting_to_backfill',
    );
    await eventually(() => viewer.locator('#workers').textContent()).toContain(
      'staging worker missing',
    );
    expect(await viewer.locator('[data-role=mode]').textContent()).toBe('read-only');

    // Watched from before the worker starts: a backfill in progress, with its progress bar.
    const sawBackfill = viewer
      .locator('article[data-lifecycle="backfilling"] [role=progressbar]')
      .first()
      .waitFor({ timeout: 60_000 })
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    // And its pace: keys a second and the time it has left (status().backfill.rate).
    const sawPace = viewer
      .locator('article[data-lifecycle="backfilling"] [data-role=pace]')
      .first()
      .waitFor({ timeout: 90_000 })
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    // A transaction in the middle of a write to customers (a session of its own): installing
    // capture there waits for it, and the page names it.
    const blocker = sqlClient(db.url, { max: 1 });
    try {
      const [row] = await blocker<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
      await blocker`BEGIN`;
      await blocker`UPDATE customers SET name = name WHERE id = 1`;
      worker = await startShopWorker(db.url);
      const wait = card(viewer, 'customers_by_country').locator('[data-section=capture-wait]');
      await wait.waitFor({ timeout: 30_000 });
      const waitText = await wait.textContent();
      expect(waitText).toContain('install on public.customers needs SHARE ROW EXCLUSIVE');
      expect(waitText).toContain(String(row!.pid));
      expect(waitText).toContain('idle in transaction');
      expect(waitText).toContain('UPDATE customers SET name = name WHERE id = 1');
      await blocker`COMMIT`;
    } finally {
      await blocker.end({ timeout: 2 });
    }
    const missed = (await sawBackfill) ?? (await sawPace);
    if (missed) throw missed;
    expect(
      await viewer.locator('[data-role=pace]').first().textContent(),
      'the pace shown while backfilling',
    ).toMatch(/^ · [\d,]+ keys\/s/);
    for (const target of [
      'customer_revenue',
      'product_sales',
      'open_orders',
      'customers_by_country',
    ]) {
      await eventually(() => card(viewer, target).getAttribute('data-lifecycle'), 60_000).toBe(
        'live',
      );
    }
    await eventually(() =>
      card(viewer, 'product_sales').locator('[data-role=lag]').textContent(),
    ).toBe('caught up');
    expect(await viewer.locator('button[data-action]').count()).toBe(0);
    // Several waits of up to a minute each, on a machine the suite shares.
  }, 300_000);

  it('renders every name from the database as text', async () => {
    const hostile = card(viewer, HOSTILE_TARGET);
    await eventually(() => hostile.locator('[data-section=held]').count(), 30_000).toBe(1);
    expect(await hostile.locator('h2').textContent()).toBe(HOSTILE_TARGET);
    const held = await hostile.locator('[data-section=held]').textContent();
    expect(held).toContain(`${HOSTILE_TARGET}.ratio`);
    expect(held).toContain('division by zero');
    expect(await hostile.locator('.statement').textContent()).toContain(HOSTILE_COLUMN);
    // Nothing ran and nothing became an element.
    expect(await viewer.locator('img, article script').count()).toBe(0);
    expect(dialogs).toEqual([]);
    // The gap comes with its fix.
    const gaps = await card(viewer, 'customers_by_country')
      .locator('[data-section=index-gaps]')
      .textContent();
    expect(gaps).toContain('CREATE INDEX CONCURRENTLY');
    // And its form for a migration's transaction.
    expect(
      await card(viewer, 'customers_by_country')
        .locator('[data-role=fix-in-migration]')
        .textContent(),
    ).toBe('CREATE INDEX ON public.customers (country)');
  });

  it("draws each transform's lag and changed keys over the last hour from the engine's samples", async () => {
    // The staging worker samples every 10 s what changed since (ADR 0063): a writer keeps
    // product_sales changing until it has three samples.
    const lag = card(viewer, 'product_sales').locator('svg[data-chart=lag]');
    let writing = true;
    const writer = (async () => {
      for (let id = 1; writing; id += 1) {
        await db.sql`UPDATE order_lines SET quantity = quantity + 1 WHERE id = ${id}`;
        await new Promise((resolve) => setTimeout(resolve, 500)); // pacing of the writer
      }
    })();
    try {
      await eventually(
        async () => Number(await lag.getAttribute('data-points')),
        60_000,
      ).toBeGreaterThanOrEqual(3);
    } finally {
      writing = false;
      await writer;
    }
    // Read at once: the page redraws every second, and reads the samples every 10 s.
    const read: ChartRead = await lag.evaluate((el) => ({
      points: Number(el.getAttribute('data-points')),
      times: el.getAttribute('data-times')!,
      drawn: el.querySelector('polyline')!.getAttribute('points')!,
      keys: Number(
        el.closest('article')!.querySelector('svg[data-chart=keys]')!.getAttribute('data-points'),
      ),
    }));
    const times = read.times.split(' ');
    const drawn = read.drawn.trim().split(/\s+/);
    expect(times).toHaveLength(read.points);
    expect(drawn).toHaveLength(read.points);
    // Each point is a sample the staging worker wrote to the catalog, oldest first, and its
    // height follows that sample's lag (y grows downwards; the top is the hour's max).
    const catalog = await db.sql<{ at: Date; lag: number }[]>`
      SELECT s.at, round(s.lag_seconds::numeric, 3)::float8 AS lag
        FROM trellis.samples s JOIN trellis.transforms t ON t.id = s.transform_id
       WHERE t.target_name = 'product_sales' ORDER BY s.at`;
    // Samples are 10 s apart: a time matches one sample (the page's Date has milliseconds).
    const samples = times.map((t) => {
      const at = new Date(t).getTime();
      const sample = catalog.find((x) => Math.abs(x.at.getTime() - at) <= 1);
      expect(sample, `a sample at ${t} in the catalog`).toBeDefined();
      return sample!;
    });
    expect(samples.map((x) => x.at.getTime())).toEqual(
      [...samples].sort((x, y) => x.at.getTime() - y.at.getTime()).map((x) => x.at.getTime()),
    );
    const max = Math.max(...samples.map((x) => x.lag));
    if (max > 0) {
      const ys = drawn.map((p) => Number(p.split(',')[1]));
      const expected = samples.map((x) => 36 - 2 - (x.lag / max) * 32);
      for (const [i, y] of ys.entries()) expect(y).toBeCloseTo(expected[i]!, 0);
    }
    const points = read.points;
    // Keys a second: a point for each sample but the first (a rate needs two).
    expect(read.keys).toBeGreaterThanOrEqual(points - 1);
    expect(await card(viewer, 'product_sales').locator('[data-role=trend]').textContent()).toMatch(
      /caught up|lag (growing|draining|steady)/,
    );
  }, 180_000);

  it('pauses, checks and resumes through the page when authorize allows it', async () => {
    const admin = await openPage(withActions.baseUrl);
    await eventually(() => admin.locator('[data-role=mode]').textContent()).toBe('actions enabled');

    await card(admin, 'open_orders').locator('button[data-action=pause]').click();
    await eventually(() => card(admin, 'open_orders').getAttribute('data-lifecycle')).toBe(
      'paused',
    );
    expect(await card(admin, 'open_orders').locator('[data-role=pause-reason]').textContent()).toBe(
      'operator',
    );
    expect(await lifecycle('open_orders')).toBe('paused');
    // The read-only page sees the pause, and still offers nothing.
    await eventually(() => card(viewer, 'open_orders').getAttribute('data-lifecycle')).toBe(
      'paused',
    );
    expect(await viewer.locator('button[data-action]').count()).toBe(0);

    await card(admin, 'customer_revenue').locator('button[data-action=selfCheck]').click();
    await eventually(
      () => card(admin, 'customer_revenue').locator('[data-check-state]').textContent(),
      30_000,
    ).toBe('consistent');

    // A screenshot of the page's states: a paused transform, held keys, an index gap, a check.
    await screenshot(admin, 'operations-page.png');
    const dark = await openPage(withActions.baseUrl, 'dark');
    await card(dark, 'open_orders').waitFor();
    await screenshot(dark, 'operations-page-dark.png');

    await card(admin, 'open_orders').locator('button[data-action=resume]').click();
    await eventually(() => card(admin, 'open_orders').getAttribute('data-lifecycle'), 30_000).toBe(
      'live',
    );
    expect(await lifecycle('open_orders')).toBe('live');
    expect(dialogs).toEqual([]);
  }, 180_000);
});
