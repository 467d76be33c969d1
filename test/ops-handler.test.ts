import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type OpsActionName, type OpsSnapshot, opsHandler } from '../src/ops/index.js';
import { livePipeline } from './support/live.js';
import { waitForStatus } from './support/trellis.js';

// The operations page's handler on a plain node:http server, as an app without a framework
// mounts it: what it serves, and what it refuses. Actions change what status() says, through
// the same apply()/releaseKey() an app's code calls.

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE ops_items (id int PRIMARY KEY, kind text NOT NULL, n int NOT NULL);
      INSERT INTO ops_items SELECT i, 'k' || (i % 3), i FROM generate_series(1, 30) i;`);
  },
});

const TOTALS = {
  target: 'ops_totals',
  from: 'ops_items',
  select: 'kind, sum(n) AS total',
  groupBy: 'kind',
};

let server: Server;
let base = '';
/** Every authorize call, as `action` (the handler asks per action). */
const asked: OpsActionName[] = [];

beforeAll(async () => {
  await live.define(
    TOTALS,
    // Fails for the row with n = 10: one held key.
    { target: 'ops_ratios', from: 'ops_items', select: '100 / (n - 10) AS ratio', implicit: 'id' },
  );
  const readOnly = opsHandler({ trellis: live.trellis, title: 'Ops <b>"x"</b>' });
  const admin = opsHandler({
    trellis: live.trellis,
    authorize: (request: IncomingMessage, action) => {
      asked.push(action);
      return action !== 'selfCheck' && request.headers.authorization === 'Bearer ok';
    },
  });
  server = createServer((req, res) => {
    if (req.url?.startsWith('/admin/')) admin(req, res);
    else if (req.url?.startsWith('/preparsed/')) {
      // As Express's express.json() leaves it: the body parsed, the stream read.
      let text = '';
      req.on('data', (c: Buffer) => (text += c.toString()));
      req.on('end', () => admin(Object.assign(req, { body: JSON.parse(text) }), res));
    } else readOnly(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise((resolve) => server?.close(resolve));
});

function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(`${base}${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-trellis-ops': '1',
      authorization: 'Bearer ok',
      ...headers,
    },
    body: JSON.stringify(body),
  });
}

describe('opsHandler on node:http', () => {
  it('serves a self-contained page under a strict CSP, the title escaped, wherever mounted', async () => {
    for (const path of ['/', '/ops', '/deep/er/ops/']) {
      const res = await fetch(`${base}${path}`);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
      const csp = res.headers.get('content-security-policy') ?? '';
      expect(csp).toContain("default-src 'none'");
      expect(csp).toMatch(/script-src 'sha256-[^']+'/);
      expect(csp).not.toContain('unsafe-inline');
      const html = await res.text();
      expect(html).toContain('<title>Ops &lt;b&gt;&quot;x&quot;&lt;/b&gt;</title>');
      // Nothing is fetched from elsewhere.
      expect(html).not.toMatch(/(src|href)="(https?:)?\/\//);
    }
  });

  it('serves the snapshot: every transform, its status and held keys, no actions without authorize', async () => {
    await waitForStatus(live.trellis, 'ops_ratios', 'live');
    const res = await fetch(`${base}/ops/snapshot.json`);
    expect(res.headers.get('cache-control')).toBe('no-store');
    const snap = (await res.json()) as OpsSnapshot;
    expect(snap.actions).toEqual([]);
    expect(snap.workers).toEqual({ staging: true, drain: true });
    expect(snap.transforms.map((t) => t.target)).toEqual(['ops_ratios', 'ops_totals']);
    const ratios = snap.transforms.find((t) => t.target === 'ops_ratios')!;
    expect(ratios.statement).toContain('TRANSFORM ops_ratios');
    // Held for the column whose expression fails; the row flows on without it.
    expect(ratios.held.map((a) => a.address)).toEqual(['ops_ratios.ratio']);
    expect(ratios.held[0]!.samples.map((s) => [s.srcTable, s.key])).toEqual([
      ['public.ops_items', '10'],
    ]);
    expect(ratios.status.heldKeys).toBe(ratios.held[0]!.count);
  });

  it('lists the actions authorize allows for the request', async () => {
    const ok = (await (
      await fetch(`${base}/admin/snapshot.json`, { headers: { authorization: 'Bearer ok' } })
    ).json()) as OpsSnapshot;
    expect(ok.actions).toEqual(['pause', 'resume', 'release']);
    const other = (await (await fetch(`${base}/admin/snapshot.json`)).json()) as OpsSnapshot;
    expect(other.actions).toEqual([]);
  });

  it('refuses actions without authorize, from another site, without the header, or not allowed', async () => {
    const cases: [string, Record<string, string>, number][] = [
      ['/ops/actions/pause', {}, 403], // read-only handler
      ['/admin/actions/pause', { 'sec-fetch-site': 'cross-site' }, 403],
      ['/admin/actions/pause', { 'x-trellis-ops': '' }, 403],
      ['/admin/actions/pause', { 'content-type': 'text/plain' }, 415],
      ['/admin/actions/pause', { authorization: 'Bearer no' }, 403],
      ['/admin/actions/selfCheck', {}, 403],
      ['/admin/actions/drop', {}, 404],
    ];
    for (const [path, headers, status] of cases) {
      const res = await post(path, { target: 'ops_totals' }, headers);
      expect({ path, headers, status: res.status }).toEqual({ path, headers, status });
    }
    expect((await fetch(`${base}/admin/actions/pause`)).status).toBe(405);
    expect((await live.trellis.status('ops_totals')).status).toBe('live');
  });

  it('answers bad bodies and unknown targets with the error code', async () => {
    const noTarget = await post('/admin/actions/pause', {});
    expect(noTarget.status).toBe(400);
    expect(await noTarget.json()).toEqual({
      error: { code: 'validation', message: 'the action needs "target"' },
    });
    const unknown = await post('/admin/actions/pause', { target: 'nope' });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: { code: string } }).error.code).toBe('not_found');
    // A name is quoted into the statement, never read as grammar.
    const sneaky = await post('/admin/actions/pause', { target: 'ops_totals; DROP TRANSFORM x' });
    expect(sneaky.status).toBe(404);
  });

  it('pauses and resumes through apply(), and releases a key through releaseKey()', async () => {
    const paused = await post('/admin/actions/pause', { target: 'ops_totals' });
    expect(await paused.json()).toEqual({ result: { kind: 'paused', address: 'ops_totals' } });
    expect(await live.trellis.status('ops_totals')).toMatchObject({
      status: 'paused',
      pauseReason: 'operator',
    });
    const resumed = await post('/preparsed/actions/resume', { target: 'ops_totals' });
    expect(await resumed.json()).toEqual({
      result: { kind: 'resumed', addresses: ['ops_totals'] },
    });
    await waitForStatus(live.trellis, 'ops_totals', 'live');

    // Released while its row still fails: re-derived at once, and held again with the error.
    const released = await post('/admin/actions/release', {
      target: 'ops_ratios',
      address: 'ops_ratios.ratio',
      srcTable: 'public.ops_items',
      key: '10',
    });
    expect(await released.json()).toEqual({
      result: {
        released: false,
        address: 'ops_ratios.ratio',
        error: 'division by zero',
        sqlstate: '22012',
      },
    });
    expect((await live.trellis.status('ops_ratios')).heldKeys).toBe(1);
    expect(asked).toContain('release');
  });
});

describe('the last hour of each transform (the charts)', () => {
  interface SampleRow {
    at: Date;
    lag_seconds: number;
    keys: string;
  }

  it('serves history.json from the samples the staging worker takes, keys a second from the drain', async () => {
    await waitForStatus(live.trellis, 'ops_totals', 'live');
    const s = live.db.sql;
    // Samples taken by the engine's own function, as the staging worker takes them every
    // 10 s; between them, changes the drain applies.
    await s`SELECT trellis._sample()`;
    await s`UPDATE ops_items SET n = n + 1 WHERE id <= 20`;
    await live.converged(TOTALS);
    // The drain loops record what they applied at most a second later.
    const totals = await s<{ id: number }[]>`
      SELECT id FROM trellis.transforms WHERE target_name = 'ops_totals'`;
    const id = totals[0]!.id;
    const applied = async () =>
      Number(
        (
          await s<
            { keys: string }[]
          >`SELECT keys::text FROM trellis.drain_time WHERE transform_id = ${id}`
        )[0]?.keys ?? 0,
      );
    const before = (
      await s<SampleRow[]>`
      SELECT at, lag_seconds, keys::text AS keys FROM trellis.samples
       WHERE transform_id = ${id} ORDER BY at DESC LIMIT 1`
    )[0]!;
    await expect.poll(applied, { timeout: 10_000 }).toBeGreaterThan(Number(before.keys));
    await s`SELECT trellis._sample()`;

    const res = await fetch(`${base}/ops/history.json`);
    expect(res.headers.get('cache-control')).toBe('no-store');
    const body = (await res.json()) as {
      transforms: Array<{
        target: string;
        samples: Array<{ at: string; lagSeconds: number; keysPerSecond: number | null }>;
      }>;
    };
    expect(body.transforms.map((t) => t.target)).toEqual(['ops_ratios', 'ops_totals']);
    const served = body.transforms.find((t) => t.target === 'ops_totals')!.samples;
    const rows = await s<SampleRow[]>`
      SELECT at, lag_seconds, keys::text AS keys FROM trellis.samples
       WHERE transform_id = ${id} ORDER BY at`;
    // Every sample of the hour, oldest first, as the catalog holds them.
    expect(served.map((x) => new Date(x.at).getTime())).toEqual(rows.map((r) => r.at.getTime()));
    expect(served.map((x) => x.lagSeconds)).toEqual(
      rows.map((r) => Math.round(r.lag_seconds * 1000) / 1000),
    );
    expect(served[0]!.keysPerSecond).toBeNull();
    // The last: the keys applied since the one before, a second.
    const [a, b] = rows.slice(-2) as [SampleRow, SampleRow];
    const expected = (Number(b.keys) - Number(a.keys)) / ((b.at.getTime() - a.at.getTime()) / 1000);
    expect(Number(b.keys) - Number(a.keys)).toBeGreaterThan(0);
    expect(served.at(-1)!.keysPerSecond).toBeCloseTo(expected, 0);
    // The handle reads the same.
    const history = await live.trellis.history();
    expect(history.find((h) => h.target === 'ops_totals')!.samples.length).toBe(rows.length);
  });

  it('keeps no sample older than an hour', async () => {
    const s = live.db.sql;
    await s`
      INSERT INTO trellis.samples (transform_id, at, lag_seconds, lag_segments, keys)
      SELECT id, now() - interval '61 minutes', 0, 0, 0 FROM trellis.transforms`;
    await s`SELECT trellis._sample()`;
    const [old] = await s<{ n: number }[]>`
      SELECT count(*)::int AS n FROM trellis.samples WHERE at < now() - interval '1 hour'`;
    expect(old!.n).toBe(0);
  });

  it("gives a backfill's rate from its keys done over the last minute, and the time it has left", async () => {
    const s = live.db.sql;
    const [t] = await s<{ id: number }[]>`
      SELECT id FROM trellis.transforms WHERE target_name = 'ops_ratios'`;
    // A sample 10 s ago at 100 keys done; 600 done now, of 1,100.
    await s`
      INSERT INTO trellis.samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
      VALUES (${t!.id}, clock_timestamp() - interval '10 seconds', 0, 0, 0, 100)`;
    const backfill = {
      keysDone: 600,
      keysTotal: 1100,
      keysHeld: 0,
      startedAt: new Date(Date.now() - 60_000).toISOString(),
    };
    const [row] = await s<{ pace: { rate: number; etaSeconds: number } }[]>`
      SELECT trellis._backfill_pace(${s.json(backfill)}::jsonb, ${t!.id}::int, true) AS pace`;
    // 500 keys in a little over 10 s; 500 left.
    expect(row!.pace.rate).toBeGreaterThan(45);
    expect(row!.pace.rate).toBeLessThanOrEqual(50);
    expect(row!.pace.etaSeconds).toBeGreaterThanOrEqual(10);
    expect(row!.pace.etaSeconds).toBeLessThan(11.2);
    // Over: no pace.
    const [over] = await s<{ pace: { rate: number | null; etaSeconds: number | null } }[]>`
      SELECT trellis._backfill_pace(${s.json(backfill)}::jsonb, ${t!.id}::int, false) AS pace`;
    expect(over!.pace).toMatchObject({ rate: null, etaSeconds: null, keysDone: 600 });
    // A live transform's status: its last build's progress, no pace.
    expect((await live.trellis.status('ops_ratios')).backfill).toMatchObject({
      rate: null,
      etaSeconds: null,
    });
  });
});
