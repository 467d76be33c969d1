import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { compareWithDefinition, type Definition } from './support/oracle.js';

// A source column retyped to a type the definition still holds is followed (ADR 0047), and
// so is everything downstream of the transform that read it (migration 0052): the union
// tables its part feeds, and the transforms reading its target or those tables. Found by
// the differential tests' view SQL (issue #24): through a UNION ALL WITH query the retype
// reached the target silently rounded; down a chain, the reader was stopped instead of
// followed. Each target is compared with its statement as written, run by Postgres,
// types included.

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE fp_n (id int PRIMARY KEY, dec4 numeric(12,2));
      INSERT INTO fp_n VALUES (1, 1.5), (2, NULL);
      CREATE TABLE fp_c (id text PRIMARY KEY, i3 int);
      INSERT INTO fp_c VALUES ('k1', 1000), ('long', -100);
      CREATE TABLE fp_d (id int PRIMARY KEY, i1 int);
      INSERT INTO fp_d VALUES (1, 2), (3, NULL);`);
  },
});

/**
 * Every target equal to its statement (rows and column types) and live, once the staging
 * worker has followed the retype (DDL is not in the ledger: a watermark token may pass
 * before its next look at the sources) and the drain applied what followed.
 */
async function followed(defs: Definition[]): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    await live.converged(defs).catch(() => undefined);
    const seen = [];
    for (const d of defs) {
      const result = await compareWithDefinition(live.db.sql, d);
      const status = await live.trellis.status(d.target);
      seen.push({
        target: d.target,
        missing: result.missing,
        extra: result.extra,
        typeMismatches: result.typeMismatches,
        status: status.status,
        failure: status.captureFailure,
        heldKeys: status.heldKeys,
      });
    }
    const expected = defs.map((d) => ({
      target: d.target,
      missing: [],
      extra: [],
      typeMismatches: [],
      status: 'live',
      failure: null,
      heldKeys: 0,
    }));
    if (JSON.stringify(seen) === JSON.stringify(expected) || Date.now() > deadline) {
      expect(seen).toEqual(expected);
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 200)); // the poll interval of this wait
  }
}

describe('a retype followed downstream', () => {
  it('reaches a target through a UNION ALL WITH query, unrounded', {
    timeout: 120_000,
  }, async () => {
    const union: Definition = {
      form: 'as',
      target: 'fp_union_retyped',
      with: 'w1 AS (SELECT sq.dec4 AS u1, sq.id AS u2 FROM fp_n sq UNION ALL SELECT sq2.dec4, sq2.id FROM fp_n sq2)',
      select: 'dt.u1::text AS g1, count(*) AS n1',
      from: 'w1 dt JOIN fp_n a ON a.id = dt.u2',
      groupBy: 'dt.u1::text',
    };
    await live.define(union);
    await live.converged(union);
    await live.db.sql.unsafe('ALTER TABLE fp_n ALTER COLUMN dec4 TYPE numeric');
    await live.db.sql.unsafe('INSERT INTO fp_n VALUES (3, 1.005)');
    // 1.005 as the statement gives it: the union's table was retyped with its branches.
    await followed([union]);
    const [row] = await live.db.sql<{ g1: string }[]>`
      SELECT g1 FROM fp_union_retyped WHERE g1 LIKE '1.00%'`;
    expect(row?.g1).toBe('1.005');
  });

  it('follows a chain over a retyped column instead of stopping it', {
    timeout: 120_000,
  }, async () => {
    const upstream: Definition = {
      target: 'fp_c_x1',
      from: 'fp_c a',
      select: 'a.i3 AS o1, a.id AS o2',
    };
    const chain: Definition = {
      target: 'fp_c_x1c',
      from: 'fp_c_x1 q',
      select: 'q.o1 AS o1',
      implicit: 'q.o2 AS o2',
      reads: [upstream],
    };
    await live.define(upstream, chain);
    await live.converged([upstream, chain]);
    await live.db.sql.unsafe('ALTER TABLE fp_c ALTER COLUMN i3 TYPE bigint');
    await live.db.sql.unsafe(
      `INSERT INTO fp_c VALUES ('k2', 5000000000); UPDATE fp_c SET id = 'K1' WHERE id = 'k1'`,
    );
    await followed([upstream, chain]);
  });

  it('retypes a UNION target whose branches read a retyped column', {
    timeout: 120_000,
  }, async () => {
    const union: Definition = {
      form: 'as',
      target: 'fp_union_top_retyped',
      select: 'a.id AS u1, a.i1 AS u2 FROM fp_d a UNION SELECT a.i1, a.id',
      from: 'fp_d a',
    };
    await live.define(union);
    await live.converged(union);
    await live.db.sql.unsafe('ALTER TABLE fp_d ALTER COLUMN i1 TYPE bigint');
    await live.db.sql.unsafe('INSERT INTO fp_d VALUES (4, 5000000000)');
    await followed([union]);
  });
});
