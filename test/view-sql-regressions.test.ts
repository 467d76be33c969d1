import { describe, it } from 'vitest';
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

/**
 * For an engine bug reported, not fixed (under `it.fails`): runs `before` (which must
 * pass), then `bug`, which must fail with an error matching `symptom`. Anything else (a
 * step before it failing, another error, no error: the bug fixed) returns normally, so the
 * `it.fails` test goes red and says so.
 */
async function knownBug(
  before: () => Promise<void>,
  bug: () => Promise<void>,
  symptom: RegExp,
): Promise<void> {
  try {
    await before();
  } catch (error) {
    console.log(`[view-sql-regressions] a step before the bug failed: ${(error as Error).message}`);
    return;
  }
  const error = await bug().then(
    () => null,
    (e: Error) => e,
  );
  if (error === null) {
    console.log('[view-sql-regressions] the bug is fixed: turn this it.fails into an it');
    return;
  }
  if (!symptom.test(error.message)) {
    console.log(`[view-sql-regressions] another failure than the bug's: ${error.message}`);
    return;
  }
  console.log(`[view-sql-regressions] the bug, as known: ${error.message.slice(0, 400)}`);
  throw error;
}

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

  // Found by seed 3 (reported, not fixed): a source column retyped from numeric(12,2) to
  // numeric, read through a UNION ALL WITH query: every part of it (the WITH query's
  // target, each branch's, the union's table) keeps the column typed numeric(12,2), so a
  // value written after the retype (1.005) reaches the target rounded (1.01), and nothing
  // says so (the target converges, holds no key, is not paused). Read through a plain
  // derived table instead, the same retype pauses the transform (capture_failure).
  it.fails('follows a retyped column through a UNION ALL WITH query (engine bug, reported)', async () => {
    const derived: Definition = {
      form: 'as',
      target: 'vr_union_retyped',
      with: 'w1 AS (SELECT sq.dec4 AS u1, sq.id AS u2 FROM vr_n sq UNION ALL SELECT sq2.dec4, sq2.id FROM vr_n sq2)',
      select: 'dt.u1::text AS g1, count(*) AS n1',
      from: 'w1 dt JOIN vr_n a ON a.id = dt.u2',
      groupBy: 'dt.u1::text',
    };
    await knownBug(
      async () => {
        await live.define(derived);
        await live.converged(derived);
        await live.db.sql.unsafe('ALTER TABLE vr_n ALTER COLUMN dec4 TYPE numeric');
        await live.db.sql.unsafe('INSERT INTO vr_n VALUES (3, 1.005)');
      },
      // The oracle finds the target's `1.01` where the statement gives `1.005`.
      () => convergedRows(derived),
      /"missing":\[\{"g1":"1\.005".*"extra":\[\{"g1":"1\.01"/,
    );
  }, 120_000);

  // Found by seed 15 (reported, not fixed; FROM-first, not view SQL): an int column read by
  // a transform another reads (a chain) retyped to bigint: the chain pauses with a capture
  // failure (in seed 15's case the upstream target also kept its column integer: the
  // oracle's types differed, `o1: integer != bigint`), where README says a retype the
  // definition still holds is followed.
  it.fails('follows a retyped column read by a transform a chain reads (engine bug, reported)', async () => {
    const upstream: Definition = {
      target: 'vr_c_x1',
      from: 'vr_c a',
      select: 'a.i3 AS o1, a.id AS o2',
    };
    const chain: Definition = {
      target: 'vr_c_x1c',
      from: 'vr_c_x1 q',
      select: 'q.o1 AS o1',
      implicit: 'q.o2 AS o2',
      reads: [upstream],
    };
    await knownBug(
      async () => {
        await live.db.sql.unsafe(`
          CREATE TABLE vr_c (id text PRIMARY KEY, i3 int);
          INSERT INTO vr_c VALUES ('k1', 1000), ('long', -100);`);
        await live.define(upstream, chain);
        await live.converged([upstream, chain]);
        await live.db.sql.unsafe('ALTER TABLE vr_c ALTER COLUMN i3 TYPE bigint');
        await live.db.sql.unsafe(
          `INSERT INTO vr_c VALUES ('k2', 7); UPDATE vr_c SET id = 'K1' WHERE id = 'k1'`,
        );
      },
      // The upstream target's o1 is still integer; the chain pauses.
      async () => {
        await convergedRows(upstream);
        await convergedRows(chain);
      },
      /integer != bigint|paused|did not converge|capture_failure/,
    );
  }, 120_000);

  // Found by seed 20 (reported, not fixed): a UNION branch selecting one column twice
  // (`SELECT sq2.id, sq2.id`) is valid SQL (the union's columns take the first branch's
  // names), but the branch is checked alone under its own names and refused: `in SELECT 2
  // of the UNION in u: column "id" specified more than once`.
  it.fails('takes a UNION branch that selects a column twice (engine bug, reported)', async () => {
    const twice: Definition = {
      form: 'as',
      target: 'vr_union_twice',
      select: 'u.u1, count(*) AS n',
      from: '(SELECT sq.id AS u1, sq.to_b AS u2 FROM vr_a sq UNION ALL SELECT sq2.id, sq2.id FROM vr_b sq2) AS u',
      groupBy: 'u.u1',
    };
    await knownBug(
      async () => undefined,
      async () => {
        await live.define(twice);
        await convergedRows(twice);
      },
      /specified more than once/,
    );
  }, 120_000);

  // Found by seed 19 (reported, not fixed): a UNION at the top over an int column retyped
  // to bigint keeps its target's column integer (the oracle's types differ; values past
  // the integer range could not be held), with no pause or capture failure.
  it.fails('retypes a UNION target when a column its branches read is retyped (engine bug, reported)', async () => {
    const union: Definition = {
      form: 'as',
      target: 'vr_union_top_retyped',
      select: 'a.id AS u1, a.i1 AS u2 FROM vr_d a UNION SELECT a.i1, a.id',
      from: 'vr_d a',
    };
    await knownBug(
      async () => {
        await live.db.sql.unsafe(`
          CREATE TABLE vr_d (id int PRIMARY KEY, i1 int);
          INSERT INTO vr_d VALUES (1, 2), (3, NULL);`);
        await live.define(union);
        await live.converged(union);
        await live.db.sql.unsafe('ALTER TABLE vr_d ALTER COLUMN i1 TYPE bigint');
        await live.db.sql.unsafe('INSERT INTO vr_d VALUES (4, 5)');
      },
      () => convergedRows(union),
      /"typeMismatches":\["u1: integer != bigint","u2: integer != bigint"\]/,
    );
  }, 120_000);
});
