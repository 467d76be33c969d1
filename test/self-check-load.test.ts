import { describe, expect, it } from 'vitest';
import type { SelfCheckJob } from '../src/engine/index.js';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition } from './support/oracle.js';
import { announceSeed, testSeeds } from './support/seeds.js';
import { corrupt, finishedJob } from './support/self-check.js';
import { runWorkload, type WorkloadResult } from './support/workload.js';
import { ACCOUNTS_DDL, accountsWorkload, seedAccounts } from './support/workload-accounts.js';

// Self-check under load (issue #11): no false findings from lag while writers run, and a
// large target checked in chunks, its progress advancing as it goes.

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(ACCOUNTS_DDL);
    await db.sql.unsafe(seedAccounts(20_000));
  },
});

const DEFINITIONS: Definition[] = [
  { target: 'ld_accounts', from: 'accounts', select: 'owner, balance', implicit: 'id' },
  {
    target: 'ld_by_owner',
    from: 'accounts',
    select: 'owner, count(*) AS n, sum(balance) AS total',
    where: "status <> 'frozen'",
    groupBy: 'owner',
  },
  {
    target: 'ld_branch',
    from: 'accounts a LEFT JOIN branches b ON b.id = a.branch_id',
    select: 'a.balance, b.city',
    where: "a.status = 'active'",
    implicit: 'a.id AS id, b.id AS b_id',
  },
];

describe.each(testSeeds([7]))('self-check while writers run (seed %i)', (seed) => {
  it('reports every target consistent, check after check, while writers write', {
    timeout: 120_000,
  }, async () => {
    announceSeed('self-check-load', seed, 'test/self-check-load.test.ts');
    await live.define(...DEFINITIONS);
    // Writers write until the checks are done: one workload after another, each planned
    // from the seed and its round.
    let checking = true;
    const writes = (async () => {
      const results: WorkloadResult[] = [];
      for (let round = 0; checking; round += 1) {
        results.push(
          await runWorkload(live.db.sql, accountsWorkload(20_000), {
            seed: seed * 1000 + round,
            writers: 3,
            operations: 150,
            longTransactions: 1,
          }),
        );
      }
      return results;
    })();
    const reports: SelfCheckJob[] = [];
    try {
      // Two rounds of checks, each target in turn.
      for (let i = 0; i < 2 * DEFINITIONS.length; i += 1) {
        const d = DEFINITIONS[i % DEFINITIONS.length]!;
        const job = await live.trellis.selfCheck(d.target, 'full');
        reports.push(await finishedJob(live.trellis, job.id, 90_000));
      }
      // A row added behind the engine's back, where no writer writes, is found (and
      // repaired) while the writes go on: lag hides nothing.
      await corrupt(
        live.db,
        'ld_accounts',
        "INSERT INTO ld_accounts (id, owner, balance) VALUES (99999999, 'ghost', 1)",
      );
      const job = await live.trellis.selfCheck('ld_accounts', 'full', { repair: true });
      const found = await finishedJob(live.trellis, job.id, 90_000);
      expect(found.report?.divergences).toEqual([{ kind: 'extra', key: '99999999' }]);
      expect(found.report?.counts).toEqual({ missing: 0, extra: 1, differs: 0 });
      expect(found.report?.repaired).toEqual({ findings: 1 });
    } finally {
      checking = false;
      const results = await writes;
      console.log(`[workload] self-check-load ${seed} ${JSON.stringify(results)}`);
      expect(results.reduce((n, r) => n + r.committed, 0)).toBeGreaterThan(100);
    }
    console.log(
      `[self-check] unsettled keys: ${reports.map((r) => `${r.target} ${r.report?.unsettledKeys}`).join(', ')}`,
    );
    for (const job of reports) {
      expect({ target: job.target, state: job.state, error: job.error }).toEqual({
        target: job.target,
        state: 'done',
        error: null,
      });
      expect({
        target: job.target,
        counts: job.report?.counts,
        listed: job.report?.divergences,
      }).toEqual({
        target: job.target,
        counts: { missing: 0, extra: 0, differs: 0 },
        listed: [],
      });
      expect(job.report?.outcome).toBe('consistent');
      expect(job.report?.rowsCompared).toBeGreaterThan(0);
    }
    await live.converged(DEFINITIONS);
  });
});

describe('a large target', () => {
  it('is checked in chunks of keys, rowsCompared advancing, every row compared once', {
    timeout: 120_000,
  }, async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE ld_big (id bigint PRIMARY KEY, v int NOT NULL, note text);
      INSERT INTO ld_big SELECT i, i % 1000, 'n' || (i % 77) FROM generate_series(1, 1000000) i;
      ANALYZE ld_big;`);
    const d: Definition = {
      target: 'ld_big_t',
      from: 'ld_big',
      select: 'v * 2 AS v2, note',
      implicit: 'id',
    };
    await live.define(d);
    const started = await live.trellis.selfCheck(d.target, 'full');
    const seen: number[] = [];
    const job = await finishedJob(live.trellis, started.id, 120_000, (j) => {
      if (j.state === 'running' && seen.at(-1) !== j.rowsCompared) seen.push(j.rowsCompared);
    });
    expect(job.state).toBe('done');
    console.log(
      `[self-check] 1M rows in ${job.finishedAt!.getTime() - job.startedAt!.getTime()} ms`,
    );
    expect(job.report).toMatchObject({ outcome: 'consistent', rowsCompared: 1_000_000 });
    expect(job.rowsCompared).toBe(1_000_000);
    expect(job.rowsTotal).toBeGreaterThan(900_000);
    // Progress was seen moving through several chunks before the end.
    const between = seen.filter((n) => n > 0 && n < 1_000_000);
    expect(between.length).toBeGreaterThanOrEqual(3);
    expect([...between].sort((a, b) => a - b)).toEqual(between);
    await expectMatchesDefinition(live.db.sql, d);
  });
});
