import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { serveMetrics, Trellis } from '../src/engine/index.js';
import { workerHealthReport } from '../src/engine/metrics/serve-metrics.js';
import { latestVersion } from '../src/engine/schema/install-sql.js';
import { spawnTrellisCli } from './support/cli.js';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { parseScrape } from './support/prometheus.js';
import { migratedTrellis, quietLogger, waitFor, waitForStatus } from './support/trellis.js';

// Metrics from every process (issue #23 item 3): `trellis worker --metrics-port` and
// serveMetrics() serve /metrics and /healthz; the alert rules and the dashboard in docs/
// use only series the metrics output has.
const repo = resolve(import.meta.dirname, '..');
const version = (
  JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as { version: string }
).version;

const totals: Definition = {
  target: 'totals',
  from: 'items',
  select: 'kind, sum(n) AS n',
  groupBy: 'kind',
};

async function get(url: string): Promise<{ status: number; text: string }> {
  const res = await fetch(url);
  return { status: res.status, text: await res.text() };
}

/** The series names a PromQL expression reads (trellis_*, labels aside). */
function seriesIn(expr: string): string[] {
  return [...expr.matchAll(/\btrellis_[a-z_]+\b/g)]
    .map((m) => m[0])
    .filter((name) => name !== 'trellis_instance');
}

describe('metrics from every process', { timeout: 180_000 }, () => {
  it('trellis worker --metrics-port serves /metrics and /healthz while it works', async () => {
    const db = await freshDatabase();
    await db.sql`CREATE TABLE items (id int PRIMARY KEY, kind text NOT NULL, n int NOT NULL)`;
    await db.sql`INSERT INTO items SELECT g, 'k' || (g % 3), g FROM generate_series(1, 50) g`;
    await using trellis = await migratedTrellis(db);
    await trellis.apply(transformStatement(totals));

    const worker = spawnTrellisCli(
      ['worker', '--drain-threads', '1', '--metrics-port', '0', '--metrics-host', '127.0.0.1'],
      { DATABASE_URL: db.url },
    );
    try {
      let started: { metrics?: string; metricsPort?: number } | undefined;
      await waitFor(
        async () => {
          const line = worker.output.stdout
            .split('\n')
            .filter((l) => l.startsWith('{'))
            .map((l) => JSON.parse(l) as { msg: string; metricsPort?: number; metrics?: string })
            .find((l) => l.msg === 'worker started');
          started = line;
          return line !== undefined;
        },
        'the worker to start',
        120_000,
      );
      const base = `http://127.0.0.1:${started?.metricsPort}`;
      expect(started?.metrics).toBe(`${base.replace('127.0.0.1', '127.0.0.1')}/metrics`);

      await waitForStatus(trellis, 'totals', 'live', 60_000);
      await expectMatchesDefinition(db.sql, totals);
      // Healthy once every loop has completed a pass: 200, with what the loops know.
      await waitFor(async () => (await get(`${base}/healthz`)).status === 200, 'healthz 200');
      const health = JSON.parse((await get(`${base}/healthz`)).text);
      expect(health).toMatchObject({ ok: true, problems: [], workers: { running: true } });
      expect(health.workers.staging.connected).toBe(true);
      expect(health.workers.drain).toMatchObject({ loops: 1, alive: 1, failing: 0 });

      const me = { trellis_instance: `${db.name}/trellis` };
      // A write the worker's drain loop applies: counted in that process, seen in its scrape.
      await db.sql`UPDATE items SET n = n + 1 WHERE id <= 10`;
      await trellis.awaitConverged('totals', await trellis.watermarkToken());
      await expectMatchesDefinition(db.sql, totals);
      let s = parseScrape('');
      await waitFor(async () => {
        const metrics = await get(`${base}/metrics`);
        expect(metrics.status).toBe(200);
        s = parseScrape(metrics.text);
        // The catalog series as of the scrape: read until it shows the transform live.
        return s.value('trellis_target_state', { ...me, target: 'totals', state: 'live' }) === 1;
      }, 'the scraped state to be live');
      expect(
        s.value('trellis_build_info', {
          ...me,
          version,
          schema_version: String(latestVersion()),
        }),
      ).toBe(1);
      expect(s.value('trellis_staging_leader', me)).toBe(1);
      expect(s.value('trellis_drain_loops_alive', me)).toBe(1);
      expect(s.value('trellis_worker_failing', { ...me, role: 'drain' })).toBe(0);
      expect(s.sum('trellis_keys_rederived_total', { ...me, target: 'totals' })).toBeGreaterThan(0);
      expect((await get(`${base}/nothing`)).status).toBe(404);
    } finally {
      worker.kill('SIGTERM');
    }
    expect(await worker.exited).toBe(0);
    // Its logs say only what is true of the configuration: under trigger capture (this
    // process records none) the elected WAL decoder idles, and no line says it decodes.
    const [config] = await db.sql<{ capture: string }[]>`SELECT capture FROM trellis.config`;
    const messages = worker.output.stdout
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => (JSON.parse(l) as { msg: string }).msg);
    expect(messages).toContain('staging worker elected');
    expect(messages.includes('WAL decoder elected')).toBe(config?.capture === 'logical');
  });

  it('serveMetrics(): /healthz fails with the reasons once the loops stop, or when there are none', async () => {
    const db = await freshDatabase();
    const trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
    const server = await serveMetrics(trellis, { port: 0, host: '127.0.0.1' });
    try {
      await waitFor(async () => (await get(`${server.url}/healthz`)).status === 200, 'healthz 200');
      // A loop that has completed no pass for longer than staleAfterMs is reported.
      const later = workerHealthReport(trellis, 60_000, Date.now() + 120_000);
      expect(later.ok).toBe(false);
      expect(later.problems).toEqual(
        expect.arrayContaining([
          expect.stringMatching(/^the staging loop last completed a pass 1\d\d s ago$/),
          expect.stringMatching(/^the drain loop last completed a pass 1\d\d s ago$/),
        ]),
      );
      await trellis.shutdown();
      const stopped = await get(`${server.url}/healthz`);
      expect(stopped.status).toBe(503);
      expect(JSON.parse(stopped.text)).toMatchObject({
        ok: false,
        problems: ['the workers stopped (the handle was shut down)'],
      });
    } finally {
      await server.close();
      await trellis.shutdown();
    }

    await using plain = await Trellis.connect({ url: db.url, logger: quietLogger });
    const none = await serveMetrics(plain, { port: 0, host: '127.0.0.1' });
    try {
      const refused = await get(`${none.url}/healthz`);
      expect(refused.status).toBe(503);
      expect(JSON.parse(refused.text).problems).toEqual([
        'this handle runs no workers (staging: false and drainThreads: 0)',
      ]);
    } finally {
      await none.close();
    }
  });

  it('the alert rules and the dashboard in docs/ use only series the metrics output has, each documented', async () => {
    const db = await freshDatabase();
    await using trellis = await migratedTrellis(db, { staging: true, drainThreads: 1 });
    const server = await serveMetrics(trellis, { port: 0, host: '127.0.0.1' });
    let text: string;
    try {
      text = (await get(`${server.url}/metrics`)).text;
    } finally {
      await server.close();
    }
    // Every family the registry has, with a histogram's _bucket, _sum and _count.
    const families = new Set<string>();
    for (const [, name, type] of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
      families.add(name!);
      if (type === 'histogram') {
        for (const suffix of ['_bucket', '_sum', '_count']) families.add(`${name}${suffix}`);
      }
    }
    const readme = readFileSync(join(repo, 'README.md'), 'utf8');
    const documented = (name: string) =>
      readme.includes(`\`${name.replace(/_(bucket|sum|count)$/, '')}\``);

    const rules = readFileSync(join(repo, 'docs/prometheus-alerts.yml'), 'utf8');
    const ruleExprs = [...rules.matchAll(/^\s+expr: (.+)$/gm)].map((m) => m[1]!);
    expect(ruleExprs.length).toBeGreaterThanOrEqual(10);
    const dashboard = JSON.parse(readFileSync(join(repo, 'docs/grafana-dashboard.json'), 'utf8'));
    const panelExprs: string[] = dashboard.panels.flatMap((p: { targets: { expr: string }[] }) =>
      p.targets.map((t) => t.expr),
    );
    expect(panelExprs.length).toBeGreaterThanOrEqual(15);
    const variableQueries: string[] = dashboard.templating.list
      .map((v: { definition?: string }) => v.definition)
      .filter(Boolean);

    const used = new Set(
      [...ruleExprs, ...panelExprs, ...variableQueries].flatMap((e) => seriesIn(e)),
    );
    // The README's "no staging worker" alert is among the rules.
    expect(ruleExprs).toContain('sum by (trellis_instance) (trellis_staging_leader) == 0');
    for (const name of used) {
      expect(families.has(name), `${name} is in the metrics output`).toBe(true);
      expect(documented(name), `${name} is in README's metrics table`).toBe(true);
    }
    expect(used.size).toBeGreaterThanOrEqual(20);
  });
});
