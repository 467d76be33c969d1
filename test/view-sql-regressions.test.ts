import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { compareWithDefinition, type Definition } from './support/oracle.js';

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
      INSERT INTO vr_n VALUES (1, 1.5), (2, NULL);
      CREATE TABLE vr_t (id int PRIMARY KEY, grp int NOT NULL, v int);
      CREATE TABLE vr_d (id int PRIMARY KEY, grp text NOT NULL, flag boolean NOT NULL, v int);
      INSERT INTO vr_d VALUES (1, 'x', true, 1), (2, 'x', false, 2), (3, 'y', true, 3), (4, 'y', true, 4);
      INSERT INTO vr_t VALUES (1, 1, 5), (2, 1, 7), (3, 1, NULL), (4, 2, 7), (5, 2, 7), (6, 3, 1);`);
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

/** Waits until `d` converged, and throws what differs from the oracle's rows, if anything. */
async function convergedRows(d: Definition): Promise<void> {
  const token = await live.trellis.watermarkToken();
  await live.trellis.awaitConverged(d.target, token, { timeoutMs: 25_000 });
  const { missing, extra, typeMismatches } = await compareWithDefinition(live.db.sql, d);
  if (missing.length || extra.length || typeMismatches.length) {
    throw new Error(`${d.target} differs: ${JSON.stringify({ missing, extra, typeMismatches })}`);
  }
}

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

  // Three more, found by seeds 3, 15 and 19 (a retype not followed through a UNION's table,
  // a chain's reader stopped instead of followed), are fixed by 0052_follow_through_parts:
  // their cases are in follow-through-parts.test.ts.

  // Found by seed 20: a UNION branch selecting one column twice (`SELECT sq2.id, sq2.id`) is
  // valid SQL (the union's columns take the first branch's names), but the branch was
  // checked alone under its own names and refused: `in SELECT 2 of the UNION in u: column
  // "id" specified more than once`. Fixed by 0055_generator_findings.sql.
  it('takes a UNION branch that selects a column twice', async () => {
    const twice: Definition = {
      form: 'as',
      target: 'vr_union_twice',
      select: 'u.u1, count(*) AS n, count(u.u2) AS n2',
      from: '(SELECT sq.id AS u1, sq.to_b AS u2 FROM vr_a sq UNION ALL SELECT sq2.id, sq2.id FROM vr_b sq2) AS u',
      groupBy: 'u.u1',
    };
    const top: Definition = {
      form: 'as',
      target: 'vr_union_twice_top',
      select: 'sq.id AS u1, sq.to_b AS u2, sq.i1 AS u3',
      from: 'vr_a sq UNION SELECT sq2.id, sq2.i1, sq2.i1 FROM vr_b sq2 WHERE sq2.i1 IS NOT NULL',
    };
    const defs = [twice, top];
    await live.define(...defs);
    for (const d of defs) await convergedRows(d);
    // Shown as written (the names only the engine's check gave are not in it).
    const shown = (await live.trellis.definitions()).map((d) => d.statement).join('\n');
    expect(shown).toMatch(/SELECT sq2\.id, sq2\.id FROM/);
    expect(shown).not.toMatch(/trellis#c/);
    await live.db.sql.unsafe(`
      INSERT INTO vr_b VALUES (4, 4), (5, NULL);
      UPDATE vr_b SET id = 6 WHERE id = 1;
      UPDATE vr_a SET to_b = 3 WHERE id = 2;
      DELETE FROM vr_b WHERE id = 3;`);
    for (const d of defs) await convergedRows(d);
  }, 120_000);

  // Found by seeds 1 and 3: a top-N's rank filter in brackets (`WHERE (dt.rn <= 1)`, as
  // pg_get_viewdef() writes every condition) was not seen, and the statement refused as
  // not filtering its rank. Fixed by 0055_generator_findings.sql.
  it('reads a top-N rank filter written in brackets', async () => {
    const bracketed: Definition = {
      form: 'as',
      target: 'vr_topn_bracketed',
      select: 'dt.id AS o1, dt.rn',
      from: `(SELECT sq.id AS id, sq.grp AS p1, row_number() OVER (PARTITION BY sq.grp ORDER BY sq.v DESC, sq.id) AS rn
               FROM vr_t sq) AS dt`,
      where: '(dt.rn <= 1) AND (dt.id > 0)',
    };
    const nested: Definition = {
      form: 'as',
      target: 'vr_topn_nested',
      select: 'dt.p1, count(*) AS n',
      from: `(SELECT sq.id AS id, sq.grp AS p1, dense_rank() OVER (PARTITION BY sq.grp ORDER BY sq.v) AS rn
               FROM vr_t sq WHERE sq.v IS NOT NULL) AS dt`,
      where: '((dt.id > 0) AND ((dt.rn < 3)))',
      groupBy: 'dt.p1',
    };
    const defs = [bracketed, nested];
    await live.define(...defs);
    for (const d of defs) await convergedRows(d);
    await live.db.sql.unsafe(`
      INSERT INTO vr_t VALUES (7, 3, 9), (8, 2, NULL), (9, 4, 1);
      UPDATE vr_t SET v = 100 WHERE id = 1;
      UPDATE vr_t SET grp = 3 WHERE id = 4;
      DELETE FROM vr_t WHERE id = 2;`);
    for (const d of defs) await convergedRows(d);
  }, 120_000);

  // Found by seed 7: a semi- or anti-join as a term of an OR, in brackets (`((EXISTS (…)) OR
  // (x > 1))`, as pg_get_viewdef() writes it), was refused as "inside an AND or another
  // expression under an OR". Fixed by 0055_generator_findings.sql.
  it('keeps subquery predicates that are bracketed terms of an OR', async () => {
    const orExists: Definition = {
      form: 'as',
      target: 'vr_or_exists',
      select: 'a.id AS o1, a.tag',
      from: 'vr_a a',
      where: '((EXISTS (SELECT 1 FROM vr_b sq WHERE sq.id = a.to_b AND sq.i1 > 15)) OR (a.i1 > 5))',
    };
    const orNotIn: Definition = {
      form: 'as',
      target: 'vr_or_not_in',
      select: 'a.id AS o1',
      from: 'vr_a a',
      where: "(a.id > 0) AND (((a.i1 NOT IN (SELECT sq.i1 FROM vr_b sq))) OR ((a.tag = 'x')))",
    };
    const defs = [orExists, orNotIn];
    await live.define(...defs);
    for (const d of defs) await convergedRows(d);
    await live.db.sql.unsafe(`
      INSERT INTO vr_b VALUES (7, 7), (8, NULL);
      UPDATE vr_a SET to_b = 3 WHERE id = 1;
      UPDATE vr_a SET i1 = 6 WHERE id = 3;`);
    for (const d of defs) await convergedRows(d);
    await live.db.sql.unsafe(`
      DELETE FROM vr_b WHERE i1 IS NULL;
      UPDATE vr_a SET tag = NULL WHERE id = 4;`);
    for (const d of defs) await convergedRows(d);
  }, 120_000);

  // Found by a run drawing retypes and renames in every case: a source column renamed that
  // a DISTINCT ON reads only in its ORDER BY (or DISTINCT ON) stopped the transform
  // (capture_failure, "its definition no longer holds") instead of being followed. Fixed by
  // 0055_generator_findings.sql.
  it('follows a column renamed in a DISTINCT ON and its ORDER BY', async () => {
    const before: Definition = {
      form: 'as',
      target: 'vr_distinct_on_renamed',
      select: 'DISTINCT ON (d.grp) d.grp AS g1, d.id AS o1, d.v + 1 AS o2',
      from: 'vr_d d ORDER BY d.grp, d.flag, d.id',
    };
    await live.define(before);
    await convergedRows(before);
    await live.db.sql.unsafe(`
      ALTER TABLE vr_d RENAME COLUMN flag TO flag_r;
      ALTER TABLE vr_d RENAME COLUMN grp TO grp_r;`);
    await live.db.sql.unsafe(`
      UPDATE vr_d SET flag_r = false WHERE id = 4;
      INSERT INTO vr_d VALUES (5, 'x', false, 0), (6, 'z', true, 6);
      DELETE FROM vr_d WHERE id = 2;`);
    const after: Definition = {
      ...before,
      select: 'DISTINCT ON (d.grp_r) d.grp_r AS g1, d.id AS o1, d.v + 1 AS o2',
      from: 'vr_d d ORDER BY d.grp_r, d.flag_r, d.id',
    };
    await convergedRows(after);
    expect((await live.trellis.status(before.target)).status).toBe('live');
  }, 120_000);

  // Found by seed 15 under TRELLIS_TEST_GEN_FOCUS='derived set operation,set operation' (WAL
  // capture; the shrunk case needs neither): a RIGHT JOIN after a LEFT JOIN (ADR 0073) with
  // `COLLATE "C"` in its SELECT list and GROUP BY is refused, valid SQL: "a RIGHT JOIN after
  // another join needs every column written with its table's alias (alias.column): "C"".
  // The check of bare names (`_outer_join_later`, 0054, wrapped in 0059) takes the quoted
  // collation name after COLLATE for a column; fixed in migration 0063 (collation names are
  // not columns).
  it('takes COLLATE "C" under a RIGHT JOIN after a LEFT JOIN', async () => {
    const collated: Definition = {
      form: 'as',
      target: 'vr_collate_right',
      select: 'a.tag COLLATE "C" AS g1, count(*) AS n1',
      from: 'vr_a a LEFT JOIN vr_b b ON b.id = a.to_b RIGHT JOIN vr_n n ON n.id = a.id',
      groupBy: 'a.tag COLLATE "C"',
    };
    await live.define(collated);
    await convergedRows(collated);
    await live.db.sql.unsafe(`
      INSERT INTO vr_n VALUES (3, 2.5), (4, NULL);
      UPDATE vr_a SET tag = 'X' WHERE id = 1;
      DELETE FROM vr_b WHERE id = 2;`);
    await convergedRows(collated);
  }, 120_000);
});
