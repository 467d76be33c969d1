import { execFile } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { progressLine, reportText } from '../src/cli/check-output.js';
import type { SelfCheckJob } from '../src/engine/index.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { corrupt } from './support/self-check.js';
import { migratedTrellis } from './support/trellis.js';

// `trellis check` (issue #11) as an operator runs it: a child process, against an
// instance whose drain worker (this test's handle) runs the check.

const live = livePipeline();

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

function trellis(args: string[]): Promise<Result> {
  return new Promise((resolve) => {
    execFile(
      'npx',
      ['tsx', 'src/cli/main.ts', ...args],
      { env: { ...process.env, DATABASE_URL: live.db.url }, timeout: 90_000 },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

const job = (over: Partial<SelfCheckJob>): SelfCheckJob => ({
  id: '5f7c9c9e-0000-4000-8000-000000000000',
  target: 'orders_by_day',
  mode: 'full',
  state: 'running',
  rowsCompared: 0,
  rowsTotal: null,
  report: null,
  error: null,
  createdAt: new Date(0),
  startedAt: null,
  finishedAt: null,
  ...over,
});

describe('trellis check output', () => {
  it('draws a progress bar over rowsCompared, full only when done', () => {
    expect(progressLine(job({ state: 'queued' }))).toBe(
      'orders_by_day: queued, waiting for a drain worker',
    );
    expect(progressLine(job({ rowsCompared: 250_000, rowsTotal: 1_000_000 }), 20)).toBe(
      'orders_by_day: [#####...............]  25% 250,000 / 1,000,000 rows',
    );
    // The total is an estimate: a running job never shows 100%.
    expect(progressLine(job({ rowsCompared: 1_200_000, rowsTotal: 1_000_000 }), 10)).toBe(
      'orders_by_day: [##########]  99% 1,200,000 / 1,000,000 rows',
    );
    expect(progressLine(job({ rowsCompared: 12 }), 4)).toBe('orders_by_day: [....]   0% 12 rows');
  });

  it('prints findings by kind, key and column', () => {
    const text = reportText(
      job({
        state: 'done',
        report: {
          outcome: 'diverged',
          divergences: [
            { kind: 'missing', key: '5' },
            {
              kind: 'differs',
              key: '{7,a}',
              columns: [{ column: 'n', target: null, recomputed: '3' }],
            },
          ],
          counts: { missing: 1, extra: 4, differs: 1 },
          rowsCompared: 1234,
          truncated: true,
          heldKeys: { count: 0, oldestPoisonedAt: null },
          unsettledKeys: 0,
          skippedColumns: [],
          drainFailures: [],
          repaired: null,
        },
      }),
    );
    expect(text).toBe(`trellis check orders_by_day (full): diverged
  rows compared   1,234
  findings        6 (missing 1, extra 4, differs 1)
  missing  key 5
  differs  key {7,a}: n: target NULL, recomputed 3
  … 4 more (see --max-findings)
  held keys       0
  drain failures  none
`);
  });
});

describe('trellis check', { timeout: 180_000 }, () => {
  it('exits 0 on a consistent target, 2 with the findings on a diverged one, and repairs', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE cc_items (id int PRIMARY KEY, price numeric NOT NULL);
      INSERT INTO cc_items SELECT i, i FROM generate_series(1, 100) i;`);
    const d: Definition = {
      target: 'cc_prices',
      from: 'cc_items',
      select: 'price',
      implicit: 'id',
    };
    await live.define(d);

    const consistent = await trellis(['check', 'cc_prices']);
    expect(consistent).toMatchObject({ code: 0, stderr: '' });
    expect(consistent.stdout).toContain('trellis check cc_prices (full): consistent');
    expect(consistent.stdout).toContain('rows compared   100');

    await corrupt(live.db, 'cc_prices', 'UPDATE cc_prices SET price = 0 WHERE id = 42');
    const diverged = await trellis(['check', 'cc_prices', '--json']);
    expect(diverged.code).toBe(9);
    const found = JSON.parse(diverged.stdout) as SelfCheckJob;
    expect(found).toMatchObject({ target: 'cc_prices', state: 'done' });
    expect(found.report?.divergences).toEqual([
      { kind: 'differs', key: '42', columns: [{ column: 'price', target: '0', recomputed: '42' }] },
    ]);

    const repaired = await trellis(['check', 'cc_prices', '--repair']);
    expect(repaired.code).toBe(9);
    expect(repaired.stdout).toContain('differs  key 42: price: target 0, recomputed 42');
    expect(repaired.stdout).toContain('repaired        1 findings');
    expect((await trellis(['check', 'cc_prices', '--mode', 'sample', '--sample', '50'])).code).toBe(
      0,
    );
  });

  it('refuses at once when no drain worker runs the instance, and refuses bad options', async () => {
    // Another instance in the same database, with no worker at all.
    const idle = await migratedTrellis(live.db, {
      schema: 'cc_idle',
      targetSchema: 'cc_idle_targets',
    });
    await idle.shutdown();
    const refused = await trellis([
      'check',
      'anything',
      '--schema',
      'cc_idle',
      '--target-schema',
      'cc_idle_targets',
    ]);
    expect(refused.code).toBe(6);
    expect(refused.stderr).toMatch(
      /no drain worker is running for the Trellis instance "cc_idle".*\(conflict\)\n$/,
    );
    const bad = await trellis(['check', 'cc_prices', '--mode', 'most']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--mode must be full or sample.*\(validation\)/);
  });
});
