import { describe, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

// Engine mismatches the differential tests' view SQL found (issue #24, item 4), each
// minimised to a plain case: the targets are compared with the statement as written, run
// by Postgres (the oracle), after writes.

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE vr_a (id int PRIMARY KEY, i1 int, to_b int, tag text);
      CREATE TABLE vr_b (id int PRIMARY KEY, i1 int);
      INSERT INTO vr_a VALUES (1, 1, 1, 'x'), (2, 5, 2, NULL), (3, NULL, NULL, 'y'), (4, 7, 9, 'x');
      INSERT INTO vr_b VALUES (1, 10), (2, NULL), (3, 30);
      CREATE TABLE vr_n (id int PRIMARY KEY, dec4 numeric(12,2));
      INSERT INTO vr_n VALUES (1, 1.5), (2, NULL);`);
  },
});

// Found by seed 1: a semi-join in brackets (as pg_get_viewdef() writes every condition) was
// refused as a subquery "inside another expression"; a NOT IN's `x IS NOT NULL` in
// brackets was not seen. Fixed by 0048_semi_parenthesized.sql.
const bracketedExists: Definition = {
  form: 'as',
  target: 'vr_bracketed_exists',
  select: 'a.id AS o1, a.tag',
  from: 'vr_a a',
  where: '(a.i1 > 0) AND (EXISTS (SELECT 1 FROM vr_b sq WHERE sq.id = a.to_b))',
};
const viewdefNotIn: Definition = {
  form: 'as',
  target: 'vr_viewdef_not_in',
  select: 'a.id, a.i1',
  from: 'vr_a a',
  where:
    '((a.to_b IS NOT NULL) AND (a.to_b NOT IN ( SELECT sq.id FROM vr_b sq WHERE (sq.i1 IS NOT NULL))))',
};

describe('view SQL regressions found by the differential tests', () => {
  it('keeps semi- and anti-joins written in brackets, as pg_get_viewdef() writes them', async () => {
    const defs = [bracketedExists, viewdefNotIn];
    await live.define(...defs);
    await live.converged(defs);
    await live.db.sql.unsafe(`
      INSERT INTO vr_a VALUES (5, 2, 3, 'z'), (6, 1, 2, NULL);
      UPDATE vr_b SET i1 = 20 WHERE id = 2;
      DELETE FROM vr_b WHERE id = 1;`);
    await live.converged(defs);
    await live.db.sql.unsafe(`
      INSERT INTO vr_b VALUES (9, 90), (1, NULL);
      UPDATE vr_a SET to_b = 1 WHERE id = 3;`);
    await live.converged(defs);
  }, 120_000);

  // Found by seed 3 (reported, not fixed): a source column retyped from numeric(12,2) to
  // numeric is followed by the transform, but a UNION ALL branch's part keeps its target
  // column typed numeric(12,2), so a value written after the retype (1.005) is rounded
  // (1.01) on its way through the branch.
  it.fails('follows a retyped column through a UNION ALL branch (engine bug, reported)', async () => {
    const union: Definition = {
      form: 'as',
      target: 'vr_union_retyped',
      with: 'w1 AS (SELECT sq.dec4 AS u1, sq.id AS u2 FROM vr_n sq UNION ALL SELECT sq2.dec4, sq2.id FROM vr_n sq2)',
      select: 'dt.u1::text AS g1, count(*) AS n1',
      from: 'w1 dt',
      groupBy: 'dt.u1::text',
    };
    await live.define(union);
    await live.converged(union);
    await live.db.sql.unsafe('ALTER TABLE vr_n ALTER COLUMN dec4 TYPE numeric');
    await live.db.sql.unsafe('INSERT INTO vr_n VALUES (3, 1.005)');
    // The oracle finds the target's `1.01` where the statement gives `1.005` (this test is
    // expected to fail until the engine retypes the branch's column too).
    await live.converged(union);
  }, 120_000);
});
