import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { type Copies, expectCopies } from './support/set-copies.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// INTERSECT ALL, EXCEPT ALL, set operators of different kinds in one statement (brackets,
// INTERSECT binding tighter), and set operations in a subquery or a WITH query (issue #26,
// ADR 0073). A row's count in the result is a function of its counts in the branches; a
// result of distinct rows at the top is ADR 0072's GROUP BY, any other a part of the counts
// joined with positions 1 .. count. Each target is compared with the statement as written,
// run by Postgres: through `Definition` where the target holds exactly the statement's
// columns, else by its columns (a row's copies are keyed by hidden columns: its text and
// its position), as multisets.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE shop_a (id int PRIMARY KEY, sku text, size int);
      CREATE TABLE shop_b (id int PRIMARY KEY, sku text, size int);
      CREATE TABLE recalled (id int PRIMARY KEY, sku text NOT NULL, size int);
      INSERT INTO shop_a VALUES (1, 'tee', 1), (2, 'tee', 1), (3, 'cap', NULL), (4, NULL, 2),
        (5, 'hat', 3), (6, 'sock', 1), (7, NULL, NULL), (8, 'tee', 1), (9, 'cap', NULL);
      INSERT INTO shop_b VALUES (1, 'tee', 1), (2, 'cap', NULL), (3, NULL, 2), (4, 'hat', 4),
        (5, 'belt', 1), (6, NULL, NULL), (7, 'tee', 1), (8, 'cap', NULL), (9, 'cap', NULL);
      INSERT INTO recalled VALUES (1, 'tee', 1), (2, 'cap', NULL), (3, 'hat', 3);`);
  },
});

/** Writes on every source: copies added and removed on each side, NULLs, keys. */
const steps: string[] = [
  `INSERT INTO shop_a VALUES (10, 'belt', 1), (11, 'tee', 1), (12, 'cap', NULL);
   INSERT INTO shop_b VALUES (10, 'sock', 1), (11, 'sock', 1), (12, NULL, NULL);
   INSERT INTO recalled VALUES (4, 'sock', 1);`,
  `UPDATE shop_a SET size = 4 WHERE id = 5;
   UPDATE shop_b SET sku = NULL WHERE id = 2;
   UPDATE shop_a SET id = 20 WHERE id = 1;
   UPDATE shop_b SET id = 30, size = 2 WHERE id = 5;
   UPDATE shop_a SET sku = 'cap' WHERE id = 7;
   UPDATE recalled SET size = NULL WHERE id = 1;`,
  // One copy of several deleted, then others.
  `DELETE FROM shop_a WHERE id = 2;
   DELETE FROM shop_b WHERE id IN (7, 3);
   DELETE FROM recalled WHERE id = 2;`,
  `DELETE FROM shop_a WHERE id IN (11, 20);
   DELETE FROM shop_b WHERE id = 10;
   UPDATE shop_b SET sku = 'cap', size = NULL WHERE id = 12;
   INSERT INTO recalled VALUES (5, 'belt', 2), (6, 'belt', 1);`,
  `INSERT INTO shop_a VALUES (13, 'scarf', 5), (14, 'scarf', 5); INSERT INTO shop_b VALUES (13, 'scarf', 5);
   UPDATE shop_a SET size = NULL WHERE sku = 'cap';
   DELETE FROM shop_b WHERE sku = 'belt';`,
  `DELETE FROM shop_b WHERE id = 13;
   UPDATE shop_a SET sku = NULL, size = NULL WHERE id = 6;
   TRUNCATE recalled;`,
  `INSERT INTO recalled VALUES (7, 'scarf', 5), (8, 'tee', 1);
   INSERT INTO shop_b SELECT 100 + k, 'tee', 1 FROM generate_series(1, 4) k;`,
];

const intersectAll: Copies = {
  target: 'both_all',
  columns: ['sku', 'size'],
  statement: 'SELECT sku, size FROM shop_a INTERSECT ALL SELECT sku, size FROM shop_b',
};
const exceptAll: Copies = {
  target: 'a_less_b',
  columns: ['sku', 'n'],
  statement:
    'SELECT sku, size AS n FROM shop_a WHERE id <> 4 EXCEPT ALL SELECT sku, size FROM shop_b EXCEPT ALL SELECT sku, size FROM recalled',
};
// A UNION ALL over a bracketed EXCEPT: copies of both.
const unionAllMixed: Copies = {
  target: 'a_and_b_unrecalled',
  columns: ['sku'],
  statement:
    'SELECT sku FROM shop_a UNION ALL (SELECT sku FROM shop_b EXCEPT SELECT sku FROM recalled)',
};
// INTERSECT ALL binds tighter than EXCEPT ALL.
const precedenceAll: Copies = {
  target: 'precedence_all',
  columns: ['sku', 'size'],
  statement:
    'SELECT sku, size FROM shop_a EXCEPT ALL SELECT sku, size FROM shop_b INTERSECT ALL SELECT sku, size FROM recalled',
};

// UNION then UNION ALL: (A UNION B) UNION ALL C.
const unionThenAll: Copies = {
  target: 'union_then_all',
  columns: ['sku'],
  statement:
    'SELECT sku FROM shop_a UNION SELECT sku FROM shop_b UNION ALL SELECT sku FROM recalled',
};

// Distinct results at the top: a GROUP BY of every column (the oracle's Definition).
const unionExcept: Definition = {
  form: 'as',
  target: 'union_except',
  select: 'sku FROM shop_a UNION SELECT sku FROM shop_b EXCEPT SELECT sku',
  from: 'recalled',
};
const unionIntersect: Definition = {
  form: 'as',
  target: 'union_intersect',
  select: 'sku, size FROM shop_a UNION SELECT sku, size FROM shop_b INTERSECT SELECT sku, size',
  from: 'recalled',
};
const exceptBracketed: Definition = {
  form: 'as',
  target: 'except_bracketed',
  select: 'sku, size FROM shop_a EXCEPT (SELECT sku, size FROM shop_b EXCEPT SELECT sku, size',
  from: 'recalled)',
};
// A set operation in a subquery and in a WITH query, read by a GROUP BY.
const intersectInSubquery: Definition = {
  form: 'as',
  target: 'intersect_in_subquery',
  select: 'x.sku, count(*) AS n',
  from: '(SELECT sku, size FROM shop_a INTERSECT SELECT sku, size FROM shop_b) AS x',
  groupBy: 'x.sku',
};
const exceptAllInWith: Definition = {
  form: 'as',
  target: 'except_all_in_with',
  with: 'e AS (SELECT sku FROM shop_a EXCEPT ALL SELECT sku FROM shop_b)',
  select: 'sku, count(*) AS copies',
  from: 'e',
  groupBy: 'sku',
};

// A RIGHT or FULL JOIN after a LEFT JOIN (the joins before it a union of one SELECT, read
// by a key that is never NULL). DISTINCT and GROUP BY: targets keyed by their columns.
const fullAfterLeft: Definition = {
  form: 'as',
  target: 'full_after_left',
  distinct: true,
  select: 'a.sku, b.size AS bsize, r.id AS rid, r.size',
  from: 'shop_a a LEFT JOIN shop_b b ON b.id = a.id FULL JOIN recalled r ON r.sku = a.sku AND r.size = b.size',
};
const rightAfterLeft: Definition = {
  form: 'as',
  target: 'right_after_left',
  select: 'r.sku, count(*) AS n, count(a.id) AS na, sum(b.size) AS bs, count(b.id) AS nb',
  from: 'shop_a a LEFT JOIN shop_b b ON b.sku = a.sku AND b.id > a.id RIGHT JOIN recalled r ON r.sku = a.sku',
  groupBy: 'r.sku',
};

const copies = [intersectAll, exceptAll, unionAllMixed, precedenceAll, unionThenAll];
const definitions = [
  unionExcept,
  unionIntersect,
  exceptBracketed,
  intersectInSubquery,
  exceptAllInWith,
  fullAfterLeft,
  rightAfterLeft,
];

async function convergedAll(): Promise<number[]> {
  await live.converged(definitions);
  const counts: number[] = [];
  for (const c of copies) counts.push(await expectCopies(live, c));
  return counts;
}

describe('more set operations', () => {
  it('maintains them through writes on every branch, compared with the statement as written', async () => {
    for (const c of copies) await live.trellis.apply(`TRANSFORM ${c.target} AS ${c.statement}`);
    await live.define(...definitions);
    const seen = new Set<string>();
    const record = (counts: number[]) => {
      for (const [i, n] of counts.entries()) if (n > 0) seen.add(copies[i]!.target);
    };
    record(await convergedAll());
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      record(await convergedAll());
    }
    // Every copies target held rows at some point (the comparisons were not of empty sets).
    expect([...seen].sort()).toEqual(copies.map((c) => c.target).sort());
    await live.db.sql
      .begin(async (tx) => {
        await tx.unsafe('DELETE FROM shop_a; DELETE FROM shop_b');
        throw new Error('rollback');
      })
      .catch(() => undefined);
    await convergedAll();
  }, 900_000);

  it('shows the statement as written, which defines the same transform again', async () => {
    const defs = await live.trellis.definitions();
    expect(defs.find((d) => d.target === 'a_and_b_unrecalled')?.statement).toBe(
      `TRANSFORM a_and_b_unrecalled AS ${unionAllMixed.statement}`,
    );
    expect(defs.find((d) => d.target === 'precedence_all')?.statement).toBe(
      `TRANSFORM precedence_all AS ${precedenceAll.statement}`,
    );
    expect(defs.find((d) => d.target === 'right_after_left')?.statement).toBe(
      'TRANSFORM right_after_left AS SELECT r.sku, count(*) AS n, count(a.id) AS na, sum(b.size) AS bs, count(b.id) AS nb FROM shop_a AS a LEFT JOIN shop_b AS b ON b.sku = a.sku AND b.id > a.id RIGHT JOIN recalled AS r ON r.sku = a.sku GROUP BY r.sku',
    );
    expect(defs.find((d) => d.target === 'except_all_in_with')?.statement).toBe(
      'TRANSFORM except_all_in_with AS WITH e AS (SELECT sku FROM shop_a EXCEPT ALL SELECT sku FROM shop_b) SELECT sku AS sku, count(*) AS copies FROM e GROUP BY sku',
    );
    for (const target of [
      'both_all',
      'a_less_b',
      'a_and_b_unrecalled',
      'union_except',
      'except_bracketed',
      'intersect_in_subquery',
      'except_all_in_with',
      'full_after_left',
    ]) {
      const d = defs.find((x) => x.target === target);
      expect(d?.statement).toMatch(/ (INTERSECT|EXCEPT|FULL JOIN)/);
      await live.trellis.apply(`DROP TRANSFORM ${target}`);
      await live.trellis.apply(d!.statement);
      const again = (await live.trellis.definitions()).find((x) => x.target === target);
      expect(again?.statement).toBe(d!.statement);
    }
    // EXPLAIN TRANSFORM of such a statement: its parts (the branches, the union, the counts),
    // nothing refused, nothing defined.
    const explained = await live.trellis.explain(
      `TRANSFORM explained_all AS ${precedenceAll.statement}`,
    );
    expect({ defined: explained.defined, refused: explained.refused }).toEqual({
      defined: false,
      refused: null,
    });
    expect(explained.parts.length).toBeGreaterThan(3);
    await live.db.sql.unsafe(`INSERT INTO shop_a VALUES (40, 'tee', 1), (41, 'tee', 1);
      INSERT INTO shop_b VALUES (40, 'tee', 1)`);
    await convergedAll();
  }, 300_000);

  it('refuses what it cannot keep, by name, leaving nothing behind', async () => {
    await expectRefusedAs(
      live,
      'SELECT upper(sku) FROM shop_a INTERSECT ALL SELECT sku FROM shop_b',
      'a column of a set operation must be named in its first SELECT',
    );
    await expectRefusedAs(
      live,
      'SELECT ARRAY[size] AS sizes FROM shop_a EXCEPT ALL SELECT ARRAY[size] FROM shop_b',
      'a column of an array type',
    );
  }, 60_000);
});
