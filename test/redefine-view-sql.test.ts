import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, transformStatement } from './support/oracle.js';
import { waitFor } from './support/trellis.js';

// ALTER TRANSFORM t AS <statement> into and out of the newer forms of view SQL (issue #26's
// INTERSECT/EXCEPT, set operations in a subquery, top-N written as a WITH query, LATERAL,
// RIGHT/FULL after a LEFT JOIN; ADR 0071-0073): each redefinition switches, the target then
// equals the new statement run by Postgres through writes, and one keyed by the same columns
// keeps its identity (its OID).

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE rv_a (id int PRIMARY KEY, sku text NOT NULL, size int, tags text[]);
      CREATE TABLE rv_b (id int PRIMARY KEY, sku text NOT NULL, size int);
      INSERT INTO rv_a SELECT k, 's' || (k % 6), k % 4, ARRAY['t' || (k % 3), 'u']
        FROM generate_series(1, 40) k;
      INSERT INTO rv_b SELECT k, 's' || (k % 5), k % 3 FROM generate_series(1, 30) k;`);
  },
});

/** The writes after the i-th redefinition: rows added, moved, emptied and deleted. */
const writes = (i: number) =>
  i % 2 === 0
    ? `INSERT INTO rv_a VALUES (${100 + i}, 's1', 2, ARRAY['t9']), (${200 + i}, 's9', NULL, NULL);
       INSERT INTO rv_b VALUES (${100 + i}, 's9', NULL);
       DELETE FROM rv_b WHERE id % 7 = ${i % 7};`
    : `UPDATE rv_a SET sku = 's${i % 6}', tags = ARRAY['u', 'u'] WHERE id % 5 = ${i % 5};
       UPDATE rv_b SET size = NULL WHERE id % 4 = ${i % 4};
       DELETE FROM rv_a WHERE id = ${i};`;

/** Sets `d` as the target's definition by ALTER TRANSFORM … AS and waits for the switch. */
async function redefine(d: Definition): Promise<void> {
  const result = await live.trellis.apply(`ALTER ${transformStatement(d)}`);
  expect(result.kind).toBe('redefining');
  await waitFor(
    async () => {
      const [row] = await live.db.sql<{ state: string | null }[]>`
        SELECT redefinition->>'state' AS state FROM trellis.transforms
         WHERE target_name = ${d.target} AND redefines IS NULL`;
      return row?.state === 'switched';
    },
    `${d.target} to switch to its new definition`,
    120_000,
  );
}

async function oid(target: string): Promise<number> {
  const [row] = await live.db.sql<{ oid: number }[]>`SELECT ${target}::regclass::oid::int AS oid`;
  return row!.oid;
}

describe('ALTER TRANSFORM … AS into the newer view SQL forms', () => {
  it('switches between a GROUP BY, set operations, a ranking WITH query and LATERAL, each equal to its statement through writes', {
    timeout: 600_000,
  }, async () => {
    const grouped: Definition = {
      form: 'as',
      target: 'rv_t',
      select: 'sku, count(*) AS n',
      from: 'rv_a',
      groupBy: 'sku',
    };
    // Same columns and key (sku): an INTERSECT in a subquery, read by a GROUP BY.
    const intersected: Definition = {
      form: 'as',
      target: 'rv_t',
      select: 'x.sku, count(*) AS n',
      from: '(SELECT sku, size FROM rv_a INTERSECT SELECT sku, size FROM rv_b) AS x',
      groupBy: 'x.sku',
    };
    // Same columns: EXCEPT ALL in a WITH query.
    const excepted: Definition = {
      form: 'as',
      target: 'rv_t',
      with: 'e AS (SELECT sku FROM rv_a EXCEPT ALL SELECT sku FROM rv_b)',
      select: 'sku, count(*) AS n',
      from: 'e',
      groupBy: 'sku',
    };
    // Other columns and key: top-N written as a WITH query.
    const ranked: Definition = {
      form: 'as',
      target: 'rv_t',
      with: 'r AS (SELECT id, sku, rank() OVER (PARTITION BY sku ORDER BY size DESC NULLS LAST) AS rk FROM rv_a)',
      select: 'id, sku, rk',
      from: 'r WHERE rk <= 2',
    };
    // LATERAL over unnest, then RIGHT JOIN after a LEFT JOIN, grouped.
    const lateral: Definition = {
      form: 'as',
      target: 'rv_t',
      select: 't.tag, count(*) AS n',
      from: 'rv_a a CROSS JOIN LATERAL unnest(a.tags) AS t(tag)',
      groupBy: 't.tag',
    };
    const rightAfterLeft: Definition = {
      form: 'as',
      target: 'rv_t',
      select: 'b.sku, count(*) AS n, count(a.id) AS na',
      from: 'rv_a a LEFT JOIN rv_b c ON c.id = a.id RIGHT JOIN rv_b b ON b.sku = a.sku',
      groupBy: 'b.sku',
    };
    await live.define(grouped);
    await live.converged(grouped);
    const first = await oid('rv_t');
    const sequence = [intersected, excepted, ranked, lateral, rightAfterLeft, grouped];
    for (const [i, d] of sequence.entries()) {
      await redefine(d);
      await live.converged(d);
      await live.db.sql.unsafe(writes(i));
      await live.converged(d);
      // Redefinitions keeping the columns and the key keep the table itself.
      if (d === intersected || d === excepted) expect(await oid('rv_t')).toBe(first);
    }
    const shown = (await live.trellis.definitions()).find((x) => x.target === 'rv_t');
    expect(shown?.statement).toBe(
      'TRANSFORM rv_t AS SELECT sku AS sku, count(*) AS n FROM public.rv_a GROUP BY sku',
    );
  });
});
