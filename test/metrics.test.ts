import { describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { recordSelfCheck } from '../src/engine/metrics/self-check.js';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition } from './support/oracle.js';
import { type Scrape, scrape, scrapeUntil } from './support/prometheus.js';
import { quietLogger, rejection, waitFor, waitForStatus } from './support/trellis.js';

// Issue #12: what renderPrometheus() shows while a workload runs, read back with a
// Prometheus text parser. Each series family is shown to move the way it should.

// With triggers whatever the suite's capture is: the capture wait below is trigger
// capture's lock wait (WAL capture's series are checked in wal-capture.test.ts).
const live = livePipeline({ quarantineThreshold: 1_000, capture: 'trigger' });

const instance = () => live.trellis.instance;

async function settle(...defs: Definition[]): Promise<void> {
  const token = await live.trellis.watermarkToken();
  for (const d of defs) await live.trellis.awaitConverged(d.target, token, { timeoutMs: 20_000 });
}

const items: Definition = {
  target: 'm_items_v',
  from: 'm_items',
  select: 'a, a * 2 AS doubled',
  implicit: 'id',
};

describe('renderPrometheus()', () => {
  it('parses as Prometheus text; every family has help and a type, every series its trellis_instance', async () => {
    const s = await scrape();
    expect(s.families.size).toBeGreaterThan(20);
    for (const family of s.families.values()) {
      expect(family.name).toMatch(/^trellis_/);
      expect(family.help.length).toBeGreaterThan(10);
      expect(['GAUGE', 'COUNTER', 'HISTOGRAM']).toContain(family.type);
      // (A histogram's series are read from its _count lines: the parser folds them.)
      const series =
        family.type === 'HISTOGRAM' ? s.samples(`${family.name}_count`) : s.samples(family.name);
      for (const sample of series) expect(sample.labels.trellis_instance).toBeTruthy();
    }
    expect(s.value('trellis_catalog_readable', { trellis_instance: instance() })).toBe(1);
  });

  it('shows a new transform backfilling to its total and going live', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE m_items (id int PRIMARY KEY, a int NOT NULL);
      INSERT INTO m_items SELECT i, i FROM generate_series(1, 3000) i;`);
    await live.trellis.apply(`TRANSFORM ${items.target} FROM ${items.from} SELECT ${items.select}`);
    const labels = { trellis_instance: instance(), target: items.target };
    const s = await scrapeUntil(
      (x) => x.value('trellis_target_state', { ...labels, state: 'live' }) === 1,
      'the transform to be live',
    );
    expect(s.value('trellis_backfill_keys_total', labels)).toBe(3000);
    expect(s.value('trellis_backfill_keys_done', labels)).toBe(3000);
    // One state at a time.
    expect(s.sum('trellis_target_state', labels)).toBe(1);
    expect(s.value('trellis_target_lag_segments', labels)).toBe(0);
  });

  it('lag rises while a transform is paused and falls after RESUME; the drain counts what it applied', async () => {
    const labels = { trellis_instance: instance(), target: items.target };
    // A chain over it: its state follows status(), which says catching_up while its
    // upstream is paused.
    const chain: Definition = {
      target: 'm_chain',
      from: items.target,
      select: 'doubled',
      implicit: 'id',
    };
    await live.define(chain);
    const before = await scrape();
    await live.trellis.apply(`PAUSE TRANSFORM ${items.target}`);
    // Ticks come only with writes (ADR 0012): write until it is two segments behind.
    let id = 10_000;
    let paused: Scrape | undefined;
    while (!paused && id < 10_200) {
      id += 1;
      const [before] = await live.db.sql<{ seq: string | null }[]>`
        SELECT max(seq)::text AS seq FROM trellis.ticks`;
      await live.db.sql`INSERT INTO m_items VALUES (${id}, 1)`;
      // The write's own tick (a segment), before looking.
      await waitFor(async () => {
        const [now] = await live.db.sql<{ newer: boolean }[]>`
          SELECT coalesce(max(seq) > ${before?.seq ?? '0'}::bigint, false) AS newer FROM trellis.ticks`;
        return now?.newer === true;
      }, 'a tick after the write');
      const x = await scrape();
      if ((x.value('trellis_target_lag_segments', labels) ?? 0) >= 2) paused = x;
    }
    if (!paused) throw new Error('the paused transform never fell two segments behind');
    expect(paused.value('trellis_target_state', { ...labels, state: 'paused' })).toBe(1);
    expect(
      paused.value('trellis_paused_transforms', {
        trellis_instance: instance(),
        reason: 'operator',
      }),
    ).toBe(1);
    const ledger = { trellis_instance: instance() };
    expect(paused.value('trellis_ledger_pending_rows', ledger)).toBeGreaterThan(0);
    expect(paused.value('trellis_ledger_pending_bytes', ledger)).toBeGreaterThan(0);
    expect(paused.value('trellis_ledger_size_bytes', ledger)).toBeGreaterThan(0);
    expect((await live.trellis.status(chain.target)).status).toBe('catching_up');
    expect(
      paused.value('trellis_target_state', {
        trellis_instance: instance(),
        target: chain.target,
        state: 'catching_up',
      }),
    ).toBe(1);
    // The lag grows while the transform stays paused: waited for on the metric itself.
    const lagBefore = paused.value('trellis_target_lag_seconds', labels)!;
    await scrapeUntil(
      (x) => x.value('trellis_target_lag_seconds', labels)! > lagBefore + 1,
      'the lag to grow by more than a second',
    );

    await live.trellis.apply(`RESUME TRANSFORM ${items.target}`);
    await live.db.sql`DELETE FROM m_items WHERE id > 2900 AND id <= 3000`;
    await settle(items, chain);
    await expectMatchesDefinition(live.db.sql, items);
    await expectMatchesDefinition(live.db.sql, chain);
    const after = await scrapeUntil(
      (x) =>
        x.value('trellis_target_lag_segments', labels) === 0 &&
        x.value('trellis_ledger_pending_rows', ledger) === 0,
      'lag and pending ledger rows to fall to 0',
    );
    expect(after.value('trellis_target_lag_seconds', labels)).toBe(0);
    expect(after.value('trellis_target_state', { ...labels, state: 'live' })).toBe(1);
    expect(
      after.value('trellis_target_state', {
        trellis_instance: instance(),
        target: chain.target,
        state: 'live',
      }),
    ).toBe(1);
    expect(
      after.value('trellis_paused_transforms', {
        trellis_instance: instance(),
        reason: 'operator',
      }),
    ).toBe(0);
    // The drain's counters moved by at least what was written: every inserted key was
    // re-derived and upserted, the 100 deleted rows deleted.
    const written = id - 10_000;
    const moved = (name: string) => after.sum(name, labels) - before.sum(name, labels);
    expect(moved('trellis_keys_rederived_total')).toBeGreaterThanOrEqual(written + 100);
    expect(moved('trellis_rows_upserted_total')).toBeGreaterThanOrEqual(written);
    expect(moved('trellis_rows_deleted_total')).toBeGreaterThanOrEqual(100);
    expect(moved('trellis_pages_applied_total')).toBeGreaterThanOrEqual(1);
    expect(
      after.count('trellis_page_duration_seconds', labels) -
        before.count('trellis_page_duration_seconds', labels),
    ).toBeGreaterThanOrEqual(1);
    expect(
      after.sum('trellis_ticks_sealed_total', ledger) -
        before.sum('trellis_ticks_sealed_total', ledger),
    ).toBeGreaterThanOrEqual(2);
  });

  it('held keys per address match quarantined(), and go when released', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE m_div (id int PRIMARY KEY, a numeric NOT NULL, b numeric NOT NULL);
      INSERT INTO m_div SELECT i, i, CASE WHEN i % 10 = 0 THEN 0 ELSE 1 END FROM generate_series(1, 200) i;`);
    const ratios: Definition = {
      target: 'm_ratio',
      from: 'm_div',
      select: 'a / b AS ratio, a',
      implicit: 'id',
    };
    const filtered: Definition = {
      target: 'm_ratio_f',
      from: 'm_div',
      select: 'a',
      where: 'a / b > 5',
      implicit: 'id',
    };
    await live.define(ratios, filtered);
    await live.db.sql.unsafe('INSERT INTO m_div VALUES (1001, 1, 0), (1002, 2, 0)');
    await settle(ratios, filtered);
    const entries = await live.trellis.quarantined();
    expect(entries.map((e) => [e.address, e.count])).toEqual([
      ['m_ratio.ratio', 22],
      ['m_ratio_f', 22],
    ]);
    const s = await scrapeUntil(
      (x) =>
        entries.every(
          (e) =>
            x.value('trellis_held_keys', { trellis_instance: instance(), address: e.address }) ===
            e.count,
        ),
      'held keys to match quarantined()',
    );
    expect(
      s.value('trellis_held_keys', { trellis_instance: instance(), address: 'm_ratio.ratio' }),
    ).toBe(22);
    expect(s.samples('trellis_held_keys', { target: 'm_ratio' })).toHaveLength(1);

    await live.db.sql`UPDATE m_div SET b = 1 WHERE b = 0`;
    await live.trellis.apply('RESUME TRANSFORM m_ratio');
    await live.trellis.apply('RESUME TRANSFORM m_ratio_f');
    await settle(ratios, filtered);
    expect(await live.trellis.quarantined()).toEqual([]);
    await scrapeUntil(
      (x) => x.samples('trellis_held_keys', { trellis_instance: instance() }).length === 0,
      'held keys to go',
    );
    await expectMatchesDefinition(live.db.sql, ratios);
  });

  it('counts a page that fails for no row’s fault, and the pages applied once it goes through', async () => {
    const labels = { trellis_instance: instance(), target: items.target };
    const before = await scrape();
    // A lock the page cannot get (55P03 is no row's fault): retried with backoff.
    await live.db.sql.unsafe(`
      CREATE FUNCTION m_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN RAISE EXCEPTION 'target busy' USING ERRCODE = '55P03'; END $$;
      CREATE TRIGGER m_refuse BEFORE INSERT OR UPDATE ON ${items.target}
        FOR EACH ROW EXECUTE FUNCTION m_refuse();`);
    await live.db.sql`INSERT INTO m_items VALUES (20001, 5)`;
    await scrapeUntil(
      (x) =>
        x.sum('trellis_pages_failed_total', labels) -
          before.sum('trellis_pages_failed_total', labels) >=
        2,
      'the page to fail twice',
    );
    expect((await live.trellis.status(items.target)).drainFailure?.sqlstate).toBe('55P03');
    await live.db.sql.unsafe(`DROP TRIGGER m_refuse ON ${items.target}`);
    await settle(items);
    const after = await scrape();
    expect(
      after.sum('trellis_pages_applied_total', labels) -
        before.sum('trellis_pages_applied_total', labels),
    ).toBeGreaterThanOrEqual(1);
    await expectMatchesDefinition(live.db.sql, items);
  });

  it('shows a capture wait with its blockers while a transaction holds the source', async () => {
    await live.db.sql.unsafe(
      'CREATE TABLE m_locked (id int PRIMARY KEY, v int); INSERT INTO m_locked VALUES (1, 1)',
    );
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => {
      entered = resolve;
    });
    const holder = live.db.sql.begin(async (tx) => {
      await tx`INSERT INTO m_locked VALUES (2, 2)`;
      entered();
      await gate;
    });
    await inside;
    const locked: Definition = {
      target: 'm_locked_v',
      from: 'm_locked',
      select: 'v',
      implicit: 'id',
    };
    try {
      await live.trellis.apply(
        `TRANSFORM ${locked.target} FROM ${locked.from} SELECT ${locked.select}`,
      );
      const wait = { trellis_instance: instance(), table: 'public.m_locked', operation: 'install' };
      const s = await scrapeUntil(
        (x) => (x.value('trellis_capture_wait_blockers', wait) ?? 0) >= 1,
        'the capture wait and its blocker',
      );
      expect(s.value('trellis_capture_wait_seconds', wait)).toBeGreaterThanOrEqual(0);
      // The wait's seconds grow while its blocker holds on: waited for on the metric itself.
      const waited = s.value('trellis_capture_wait_seconds', wait)!;
      await scrapeUntil(
        (x) => x.value('trellis_capture_wait_seconds', wait)! > waited + 0.5,
        'the capture wait to grow by more than half a second',
      );
    } finally {
      release();
      await holder;
    }
    await waitForStatus(live.trellis, locked.target, 'live');
    await scrapeUntil(
      (x) => x.samples('trellis_capture_wait_blockers', { table: 'public.m_locked' }).length === 0,
      'the capture wait to go',
    );
    await expectMatchesDefinition(live.db.sql, locked);
  });

  it('shows calls by method and outcome, the pools, the staging leader and the drain loops', async () => {
    const me = { trellis_instance: instance() };
    const before = await scrape();
    await live.trellis.status(items.target);
    await live.trellis.status(items.target);
    await rejection(live.trellis.status('m_nothing'));
    const s = await scrape();
    const calls = (x: Scrape, outcome: string) =>
      x.count('trellis_call_duration_seconds', { ...me, method: 'status', outcome });
    expect(calls(s, 'ok') - calls(before, 'ok')).toBe(2);
    expect(calls(s, 'not_found') - calls(before, 'not_found')).toBe(1);
    expect(s.value('trellis_staging_leader', me)).toBe(1);
    expect(s.value('trellis_drain_loops_alive', me)).toBe(2);
    expect(s.value('trellis_pool_connections_max', { ...me, pool: 'calls' })).toBe(10);
    // The staging worker, the WAL decoder (elected beside it, idle under trigger capture)
    // and two drain loops, each on its own connection.
    expect(s.value('trellis_pool_connections_max', { ...me, pool: 'workers' })).toBe(4);
    expect(s.value('trellis_pool_connections_in_use', { ...me, pool: 'workers' })).toBe(4);
    expect(s.value('trellis_pool_waiting', { ...me, pool: 'calls' })).toBe(0);
  });

  it('keeps two instances apart, and a handle’s series go when it shuts down', async () => {
    const other = await Trellis.connect({
      url: live.db.url,
      schema: 'm_other',
      logger: quietLogger,
    });
    let otherInstance: string;
    try {
      otherInstance = other.instance;
      await other.migrate();
      await other.definitions();
      // The self-check jobs' hook (issue #11) counts under the instance it is given.
      recordSelfCheck(otherInstance, {
        target: 'm_checked',
        outcome: 'divergent',
        divergences: { missing: 2, differs: 1 },
      });
      const s = await scrape();
      expect(s.labelValues('trellis_instance')).toEqual(new Set([instance(), otherInstance]));
      expect(s.value('trellis_catalog_readable', { trellis_instance: otherInstance })).toBe(1);
      expect(
        s.count('trellis_call_duration_seconds', {
          trellis_instance: otherInstance,
          method: 'migrate',
          outcome: 'ok',
        }),
      ).toBe(1);
      expect(
        s.value('trellis_self_checks_total', {
          trellis_instance: otherInstance,
          target: 'm_checked',
          outcome: 'divergent',
        }),
      ).toBe(1);
      expect(
        s.value('trellis_self_check_divergences_total', {
          trellis_instance: otherInstance,
          kind: 'missing',
        }),
      ).toBe(2);
      // No workers there: no leader or drain series for it.
      expect(s.samples('trellis_staging_leader', { trellis_instance: otherInstance })).toEqual([]);
    } finally {
      await other.shutdown();
    }
    const after = await scrape();
    expect(after.labelValues('trellis_instance')).toEqual(new Set([instance()]));

    // A handle whose catalog cannot be read: its catalog series are absent, and it says so.
    const unmigrated = await Trellis.connect({
      url: live.db.url,
      schema: 'm_unmigrated',
      logger: quietLogger,
    });
    try {
      const s = await scrape();
      const theirs = { trellis_instance: unmigrated.instance };
      expect(s.value('trellis_catalog_readable', theirs)).toBe(0);
      expect(s.samples('trellis_ledger_size_bytes', theirs)).toEqual([]);
    } finally {
      await unmigrated.shutdown();
    }
  });
});
