import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// INTERSECT and EXCEPT in a view's SQL (issue #26, ADR 0072): compiled into a GROUP BY of
// every column over a UNION ALL of the branches tagged with their place, filtered by
// HAVING. Each target is compared with the statement as written (INTERSECT, EXCEPT),
// recomputed by Postgres (the oracle), after writes to every branch's source: rows coming
// into and leaving the other side, duplicates within a side (one of two deleted), key
// changes, NULLs (equal to each other, as INTERSECT and EXCEPT treat them). Also: GROUP BY,
// HAVING and aggregates directly over a FULL JOIN, and the source indexes a join on other
// conditions than equalities needs, reported by status().

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE shop_a (id int PRIMARY KEY, sku text, size int);
      CREATE TABLE shop_b (id int PRIMARY KEY, sku text, size int);
      CREATE TABLE recalled (id int PRIMARY KEY, sku text NOT NULL, size int);
      INSERT INTO shop_a VALUES (1, 'tee', 1), (2, 'tee', 1), (3, 'cap', NULL), (4, NULL, 2),
        (5, 'hat', 3), (6, 'sock', 1), (7, NULL, NULL);
      INSERT INTO shop_b VALUES (1, 'tee', 1), (2, 'cap', NULL), (3, NULL, 2), (4, 'hat', 4),
        (5, 'belt', 1), (6, NULL, NULL);
      INSERT INTO recalled VALUES (1, 'tee', 1), (2, 'cap', NULL), (3, 'hat', 3);
      CREATE TABLE lows (id int PRIMARY KEY, lo int, hi int, label text);
      CREATE TABLE readings (id int PRIMARY KEY, v int, at int);
      INSERT INTO lows VALUES (1, 0, 10, 'low'), (2, 10, 20, 'mid'), (3, 20, NULL, 'high');
      INSERT INTO readings VALUES (1, 5, 1), (2, 15, 2), (3, NULL, 3), (4, 25, 4);`);
  },
});

/** Writes on every source: rows start and stop being on the other side, duplicates, NULLs. */
const steps: string[] = [
  `INSERT INTO shop_a VALUES (8, 'belt', 1), (9, 'tee', 1);
   INSERT INTO shop_b VALUES (7, 'sock', 1), (8, 'sock', 1), (9, NULL, NULL);
   INSERT INTO recalled VALUES (4, 'sock', 1);`,
  // Values move (a row leaves its group, one joins it), keys change, NULLs set and cleared.
  `UPDATE shop_a SET size = 4 WHERE id = 5;
   UPDATE shop_b SET sku = NULL WHERE id = 2;
   UPDATE shop_a SET id = 20 WHERE id = 1;
   UPDATE shop_b SET id = 30, size = 2 WHERE id = 5;
   UPDATE shop_a SET sku = 'cap' WHERE id = 7;
   UPDATE recalled SET size = NULL WHERE id = 1;`,
  // One of two duplicates deleted (the row stays), then the other (it goes).
  `DELETE FROM shop_a WHERE id = 2;
   DELETE FROM shop_b WHERE id IN (7, 3);
   DELETE FROM recalled WHERE id = 2;`,
  `DELETE FROM shop_a WHERE id IN (9, 20);
   DELETE FROM shop_b WHERE id = 8;
   UPDATE shop_b SET sku = 'cap', size = NULL WHERE id = 9;
   INSERT INTO recalled VALUES (5, 'belt', 2), (6, 'belt', 1);`,
  // A row on both sides in one transaction: inserted, then its counterpart deleted.
  `INSERT INTO shop_a VALUES (10, 'scarf', 5); INSERT INTO shop_b VALUES (10, 'scarf', 5);
   UPDATE shop_a SET size = NULL WHERE sku = 'cap';
   DELETE FROM shop_b WHERE sku = 'belt';`,
  `DELETE FROM shop_b WHERE id = 10;
   UPDATE shop_a SET sku = NULL, size = NULL WHERE id = 6;
   TRUNCATE recalled;`,
  // The band join's sides: rows start and stop matching, a key changes, NULL bounds.
  `INSERT INTO readings VALUES (5, 12, 5), (6, 40, 6);
   UPDATE lows SET hi = 30 WHERE id = 3;
   UPDATE readings SET v = 3 WHERE id = 2;
   UPDATE lows SET id = 10 WHERE id = 1;`,
  `DELETE FROM lows WHERE id = 2;
   UPDATE readings SET v = NULL WHERE id = 1;
   UPDATE lows SET lo = NULL WHERE id = 10;
   INSERT INTO lows VALUES (4, 35, 50, 'top');`,
];

// INTERSECT: the rows in both, once each; NULLs equal.
const both: Definition = {
  form: 'as',
  target: 'in_both',
  select: 'sku, size FROM shop_a INTERSECT SELECT sku, size',
  from: 'shop_b',
};

// EXCEPT: the rows of the first no other branch holds; the columns named as the first
// branch names them (an expression named with AS), a WHERE in a branch, and a trailing
// ORDER BY the engine drops.
const onlyA: Definition = {
  form: 'as',
  target: 'only_a',
  select:
    "coalesce(sku, '?') AS sku, size AS n FROM shop_a WHERE id <> 4 EXCEPT SELECT coalesce(sku, '?'), size",
  from: 'shop_b',
  orderBy: '1',
};

// Three branches, one a WITH query; INTERSECT DISTINCT is INTERSECT.
const everywhere: Definition = {
  form: 'as',
  target: 'everywhere',
  with: 'r AS (SELECT sku, size FROM recalled)',
  select:
    'a.sku, a.size FROM shop_a AS a INTERSECT DISTINCT SELECT b.sku, b.size FROM shop_b AS b INTERSECT SELECT r.sku, r.size',
  from: 'r',
};

// EXCEPT of three, the first branch a join.
const notElsewhere: Definition = {
  form: 'as',
  target: 'not_elsewhere',
  select:
    'a.sku, r.size FROM shop_a AS a JOIN recalled AS r ON r.sku = a.sku EXCEPT SELECT sku, size FROM shop_b EXCEPT SELECT sku, size',
  from: 'recalled WHERE id > 3',
};

// A join on other conditions than equalities (no change: its source indexes reported).
const banded: Definition = {
  form: 'as',
  target: 'banded',
  select: 'l.label, r.v',
  from: 'lows AS l JOIN readings AS r ON r.v >= l.lo AND r.v < l.hi',
  implicit: 'l.id AS id, r.id AS r_id',
};

// GROUP BY, HAVING and aggregates directly over a FULL JOIN: kept as the same GROUP BY over
// a subquery holding the FULL JOIN (a FULL JOIN's rows are a UNION ALL's, ADR 0066).
const fullGrouped: Definition = {
  form: 'as',
  target: 'full_grouped',
  select:
    'coalesce(a.sku, b.sku) AS sku, count(*) AS n, count(a.id) AS in_a, sum(b.size) AS b_size, max(a.id)',
  from: 'shop_a AS a FULL JOIN shop_b AS b ON a.sku = b.sku',
  groupBy: 'coalesce(a.sku, b.sku)',
};
const fullHaving: Definition = {
  form: 'as',
  target: 'full_having',
  select: 'b.size, count(*) AS n, count(a.id) AS matched',
  from: 'shop_a a FULL OUTER JOIN shop_b b ON a.sku = b.sku AND a.size = b.size',
  where: 'a.id IS DISTINCT FROM 4',
  groupBy: 'b.size',
  having: 'count(a.id) > 0 OR b.size IS NULL',
};
// Aggregates without GROUP BY over a FULL JOIN, reading bare column names. (Postgres runs
// a FULL JOIN only on conditions it can merge or hash: equalities.)
const fullTotal: Definition = {
  form: 'as',
  target: 'full_total',
  select:
    'count(*) AS n, count(l.id) AS matched, count(r.id) AS readings, max(label) AS top, sum(v) AS vs',
  from: 'lows AS l FULL JOIN readings AS r ON r.at = l.id',
};

// A RIGHT or FULL JOIN after other (inner) joins: those joins are kept as a subquery the
// RIGHT or FULL JOIN joins as its first join. (SELECT DISTINCT and GROUP BY: targets keyed
// by their columns, which the oracle states.)
const fullAfterJoin: Definition = {
  form: 'as',
  target: 'full_after_join',
  distinct: true,
  select: 'a.sku, b.size AS bsize, r.id AS rid, r.size',
  from: 'shop_a a JOIN shop_b b ON b.sku = a.sku FULL JOIN recalled r ON r.sku = a.sku AND r.size = b.size',
};
const rightAfterJoin: Definition = {
  form: 'as',
  target: 'right_after_join',
  select: 'r.sku, count(*) AS n, count(a.id) AS na, sum(b.size) AS bs',
  from: 'shop_a a JOIN shop_b b ON b.size = a.size RIGHT JOIN recalled r ON r.sku = b.sku',
  groupBy: 'r.sku',
  having: 'count(*) > 0',
};
const fullAfterJoinGrouped: Definition = {
  form: 'as',
  target: 'full_after_join_grouped',
  select: 'coalesce(r.sku, a.sku) AS sku, count(*) AS n, max(b.id), count(r.id) AS recalls',
  from: 'shop_a AS a INNER JOIN shop_b AS b ON b.sku = a.sku FULL JOIN recalled AS r ON r.sku = a.sku',
  where: 'b.id IS DISTINCT FROM 9',
  groupBy: 'coalesce(r.sku, a.sku)',
};

const all = [
  both,
  onlyA,
  everywhere,
  notElsewhere,
  banded,
  fullGrouped,
  fullHaving,
  fullTotal,
  fullAfterJoin,
  rightAfterJoin,
  fullAfterJoinGrouped,
];

describe('INTERSECT and EXCEPT', () => {
  it('maintains them through writes on every branch, compared with the statement as written', async () => {
    await live.define(...all);
    await live.converged(all);
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await live.converged(all);
    }
    // The oracle's results are not empty or trivial at the start (the writes above change them).
    const [n] = await live.db.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM only_a`;
    expect(n?.n).toBeGreaterThan(0);
  }, 300_000);

  it('shows the statement as written, which defines the same transform again', async () => {
    const defs = await live.trellis.definitions();
    const shown = defs.find((d) => d.target === 'everywhere')?.statement;
    expect(shown).toBe(
      'TRANSFORM everywhere AS WITH r AS (SELECT sku, size FROM recalled) SELECT a.sku, a.size FROM shop_a AS a INTERSECT SELECT b.sku, b.size FROM shop_b AS b INTERSECT SELECT r.sku, r.size FROM r',
    );
    expect(defs.find((d) => d.target === 'full_having')?.statement).toBe(
      'TRANSFORM full_having AS SELECT b.size, count(*) AS n, count(a.id) AS matched FROM shop_a AS a FULL JOIN shop_b AS b ON a.sku = b.sku AND a.size = b.size WHERE a.id IS DISTINCT FROM 4 GROUP BY b.size HAVING count(a.id) > 0 OR b.size IS NULL',
    );
    expect(defs.find((d) => d.target === 'right_after_join')?.statement).toBe(
      'TRANSFORM right_after_join AS SELECT r.sku, count(*) AS n, count(a.id) AS na, sum(b.size) AS bs FROM shop_a AS a JOIN shop_b AS b ON b.size = a.size RIGHT JOIN recalled AS r ON r.sku = b.sku GROUP BY r.sku HAVING count(*) > 0',
    );
    for (const target of [
      'everywhere',
      'only_a',
      'not_elsewhere',
      'full_having',
      'full_total',
      'right_after_join',
      'full_after_join',
    ]) {
      const d = defs.find((x) => x.target === target);
      expect(d?.statement).toMatch(/ (INTERSECT|EXCEPT|FULL JOIN|RIGHT JOIN) /);
      await live.trellis.apply(`DROP TRANSFORM ${target}`);
      await live.trellis.apply(d!.statement);
      const again = (await live.trellis.definitions()).find((x) => x.target === target);
      expect(again?.statement).toBe(d!.statement);
    }
    await live.db.sql.unsafe(`INSERT INTO shop_a VALUES (11, 'tee', 1); INSERT INTO shop_b VALUES (11, 'tee', 1);
      INSERT INTO recalled VALUES (7, 'tee', 1)`);
    await live.converged([
      everywhere,
      onlyA,
      notElsewhere,
      fullHaving,
      fullTotal,
      rightAfterJoin,
      fullAfterJoin,
    ]);
  }, 120_000);

  it('reports the source indexes a join on other conditions than equalities needs', async () => {
    const gaps = async () =>
      (await live.trellis.status('banded')).sourceIndexGaps.map(
        (g) => `${g.table}(${g.columns.join(', ')}) ${g.role}`,
      );
    // A change to readings finds lows by lo and hi; a change to lows finds readings by v.
    expect(await gaps()).toEqual([
      'public.lows(lo, hi) join_from',
      'public.readings(v) join_joined',
    ]);
    const explained = await live.trellis.explain('banded');
    expect(explained.parts.at(-1)?.needs.map((n) => `${n.table}(${n.columns.join(', ')})`)).toEqual(
      ['public.lows(lo, hi)', 'public.readings(v)'],
    );
    await live.db.sql.unsafe('CREATE INDEX ON readings (v)');
    expect(await gaps()).toEqual(['public.lows(lo, hi) join_from']);
    await live.db.sql.unsafe('CREATE INDEX ON lows (lo)');
    expect(await gaps()).toEqual([]);
  }, 60_000);

  it('refuses what it cannot keep, by name, leaving nothing behind', async () => {
    await expectRefusedAs(
      live,
      'SELECT upper(sku) FROM shop_a INTERSECT SELECT sku FROM shop_b',
      'a column of INTERSECT must be named in its first SELECT',
    );
    await expectRefusedAs(
      live,
      'SELECT coalesce(a.size, 0) + 1, count(*) AS n FROM shop_a a FULL JOIN shop_b b ON a.id = b.id GROUP BY 1',
      'GROUP BY over a FULL JOIN: name this column',
    );
    // Postgres's own check of the statement as written.
    await expectRefusedAs(
      live,
      'SELECT sku, size FROM shop_a EXCEPT SELECT sku FROM shop_b',
      'must have the same number of columns',
    );
    // Still refused (ADR 0066), by name.
    // A RIGHT or FULL JOIN after other joins reading bare names.
    await expectRefusedAs(
      live,
      'SELECT a.sku, label FROM shop_a a JOIN recalled r ON r.sku = a.sku RIGHT JOIN lows l ON l.id = r.id',
      'a RIGHT JOIN after another join needs every column written with its table',
    );
  }, 60_000);
});
