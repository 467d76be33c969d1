import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { announceSeed, testSeeds } from './support/seeds.js';
import { finishedJob } from './support/self-check.js';

// A self-check compares in one repeatable-read snapshot. A GROUP BY kept by delta that
// recomputes every group empties its key map and group states with TRUNCATE and fills
// them again (pages.ts); TRUNCATE is not MVCC-safe, so a comparison whose snapshot came
// before it read the key map empty afterwards, could not route a pending change to the
// group a row left, and reported lag as a finding ("diverged" while the target was right:
// found by self-check-load under load). Here every range is recomputed whole while rows
// move between groups, and every check must find the target consistent.

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE rc_items (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL);
      CREATE INDEX ON rc_items (g);
      INSERT INTO rc_items SELECT i, i % 200, i % 97 FROM generate_series(1, 20000) i;
      ANALYZE rc_items;`);
  },
});

const d: Definition = {
  target: 'rc_totals',
  from: 'rc_items',
  select: 'g, count(*) AS n, sum(v) AS total',
  groupBy: 'g',
};

// Under both captures. Under WAL capture a comparison's findings are compared again once
// decoded (ADR 0015, 0023); a comparison that had differences and changes decoded late
// failed on its own query (a jsonb parameter sent as a JSON string) and was retried until
// its time ran out, so checks stalled there (ADR 0076). Eight checks, each settling its
// pending keys while rows keep moving, take minutes on a loaded machine.
describe.each(testSeeds([3]))('self-check beside recomputes of every group (seed %i)', (seed) => {
  it('finds the target consistent, check after check, while rows move between groups', {
    timeout: 360_000,
  }, async () => {
    announceSeed('self-check-recompute', seed, 'test/self-check-recompute.test.ts');
    await live.define(d);
    // Every range recomputed whole: a delta priced dear per key, a recompute cheap (the
    // recompute's own measurements keep it cheap; no range is big enough to measure deltas).
    await live.db
      .sql`UPDATE trellis.pipeline p SET apply_costs = '{"delta": 1000, "recompute": 0.0001}'
                        FROM trellis.transforms t WHERE t.id = p.transform_id AND t.target_name = ${d.target}`;
    let writing = true;
    let written = 0;
    const writer = (async () => {
      let x = seed;
      while (writing) {
        // Small transactions moving a few rows to other groups, one after another.
        x = (x * 1103515245 + 12345) % 2147483648;
        await live.db.sql`UPDATE rc_items SET g = (g + ${1 + (x % 7)}) % 200, v = v + 1
                           WHERE id % 500 = ${x % 500}`;
        written += 1;
      }
    })();
    const outcomes: Array<{ outcome: string | undefined; counts: unknown; listed: unknown }> = [];
    try {
      for (let i = 0; i < 8; i += 1) {
        const job = await live.trellis.selfCheck(d.target, 'full');
        const done = await finishedJob(live.trellis, job.id, 60_000);
        outcomes.push({
          outcome: done.report?.outcome,
          counts: done.report?.counts,
          listed: done.report?.divergences,
        });
      }
    } finally {
      writing = false;
      await writer;
    }
    expect(written).toBeGreaterThan(10);
    // The drain did recompute every group while the checks ran.
    expect((await live.trellis.status(d.target)).lastApply?.mode).toBe('recompute');
    for (const o of outcomes) {
      expect(o).toEqual({
        outcome: 'consistent',
        counts: { missing: 0, extra: 0, differs: 0 },
        listed: [],
      });
    }
    await live.converged(d);
  });
});
