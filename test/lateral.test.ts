import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { waitFor, waitForStatus } from './support/trellis.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// CROSS JOIN LATERAL over a set-returning function of the row (issue #26, ADR 0071):
// unnest(array) [WITH ORDINALITY], jsonb_array_elements(jsonb), jsonb_array_elements_text,
// in the view-SQL and FROM-first forms, as a projection and under GROUP BY. Each target is
// compared with the statement as written, recomputed by Postgres, after inserts, updates
// (array changed, key moved), deletes, NULL and empty arrays, duplicate elements.

const live = livePipeline({
  drainThreads: 2,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE posts (id int PRIMARY KEY, author text, tags text[], doc jsonb, score int);
      INSERT INTO posts VALUES
        (1, 'ann', '{a,b,c}', '{"items": [{"sku": "x", "q": 1}, {"sku": "y", "q": 2}]}', 5),
        (2, 'bob', '{b,b}', '{"items": []}', 3),
        (3, 'ann', NULL, '{"items": [{"sku": "x", "q": 4}]}', NULL),
        (4, 'cy', '{}', '{}', 1),
        (5, 'bob', '{c,NULL,a}', '{"items": [1, "two", null, {"sku": "z"}]}', 7);
      CREATE TABLE authors (name text PRIMARY KEY, region text);
      INSERT INTO authors VALUES ('ann', 'eu'), ('bob', 'us');`);
  },
});

/** A transform whose oracle is the statement with WITH ORDINALITY: the target adds it. */
interface Case {
  def: Definition;
  /** The FROM the oracle runs, when the target keys rows by an ordinality not written. */
  oracleFrom?: string;
}

const cases: Case[] = [
  {
    // The position selected: the target's key is (id, n).
    def: {
      form: 'as',
      target: 'tag_rows',
      from: 'posts p CROSS JOIN LATERAL unnest(p.tags) WITH ORDINALITY AS t(tag, n)',
      select: 'p.id, p.author, t.tag, t.n',
      key: ['id', 'n'],
    },
  },
  {
    // No ordinality written: the target adds it (its column "ordinality").
    def: {
      form: 'as',
      target: 'tag_bare',
      from: 'posts p CROSS JOIN LATERAL unnest(p.tags) AS t(tag)',
      select: 'p.author, tag, upper(tag) AS up',
      where: "tag IS DISTINCT FROM 'c'",
      implicit: 'p.id AS id, t.ordinality AS ordinality',
    },
    oracleFrom: 'posts p CROSS JOIN LATERAL unnest(p.tags) WITH ORDINALITY AS t(tag, ordinality)',
  },
  {
    // jsonb_array_elements of an expression of the row, joined to another table.
    def: {
      form: 'as',
      target: 'items',
      from: "posts p CROSS JOIN LATERAL jsonb_array_elements(p.doc -> 'items') AS e(item) LEFT JOIN authors a ON a.name = p.author",
      select: "p.id, a.region, e.item, e.item ->> 'sku' AS sku",
      implicit: 'e.ordinality AS ordinality, a.name AS name',
    },
    oracleFrom:
      "posts p CROSS JOIN LATERAL jsonb_array_elements(p.doc -> 'items') WITH ORDINALITY AS e(item, ordinality) LEFT JOIN authors a ON a.name = p.author",
  },
  {
    // The comma form, jsonb_array_elements_text.
    def: {
      form: 'as',
      target: 'item_texts',
      from: "posts p, jsonb_array_elements_text(p.doc -> 'items') WITH ORDINALITY AS e(v, i)",
      select: 'p.id, e.v, e.i',
    },
  },
  {
    // The most common use: count per element.
    def: {
      form: 'as',
      target: 'tag_counts',
      from: 'posts CROSS JOIN LATERAL unnest(tags) AS t(tag)',
      select: 'tag, count(*) AS posts, sum(score) AS score',
      groupBy: 'tag',
    },
  },
  {
    // GROUP BY in the FROM-first form, with a WHERE on the element.
    def: {
      target: 'sku_totals',
      from: "posts p CROSS JOIN LATERAL jsonb_array_elements(p.doc -> 'items') AS e(item)",
      select: "item ->> 'sku' AS sku, count(*) AS n, sum((item ->> 'q')::int) AS q",
      where: "jsonb_typeof(item) = 'object'",
      groupBy: "item ->> 'sku'",
    },
  },
  {
    // JOIN LATERAL ... ON a condition of the element.
    def: {
      form: 'as',
      target: 'tag_on',
      from: "posts p JOIN LATERAL unnest(p.tags) WITH ORDINALITY AS t(tag, n) ON t.tag <> 'b'",
      select: 'p.id, t.tag, t.n',
    },
  },
  {
    // LEFT JOIN LATERAL: a row with no elements (NULL or empty array) is one row, NULLs.
    def: {
      form: 'as',
      target: 'tag_left',
      from: 'posts p LEFT JOIN LATERAL unnest(p.tags) WITH ORDINALITY AS t(tag, n) ON true',
      select: 'p.id, p.score, t.tag, t.n',
    },
  },
];

const defs = cases.map((c) => c.def);

async function converged(): Promise<void> {
  const token = await live.trellis.watermarkToken();
  for (const c of cases) {
    await live.trellis.awaitConverged(c.def.target, token, { timeoutMs: 25_000 });
    await expectMatchesDefinition(
      live.db.sql,
      c.oracleFrom ? { ...c.def, from: c.oracleFrom } : c.def,
    );
  }
}

const steps: string[] = [
  // New rows: duplicates, NULL elements, an empty array, a NULL array.
  `INSERT INTO posts VALUES (6, 'ann', '{a,a,a}', '{"items": [{"sku": "x", "q": 9}, {"sku": "x", "q": 9}]}', 2),
                            (7, 'dee', '{}', NULL, 4), (8, NULL, NULL, '{"items": [{"sku": null}]}', 0);`,
  // Arrays changed: grown, shrunk, emptied, made NULL, made non-NULL; reordered.
  `UPDATE posts SET tags = tags || '{d,a}' WHERE id = 1;
   UPDATE posts SET tags = '{b}' WHERE id = 2;
   UPDATE posts SET tags = '{}' WHERE id = 5;
   UPDATE posts SET tags = '{e,b}', doc = '{"items": [{"sku": "y", "q": 1}]}' WHERE id = 3;
   UPDATE posts SET tags = NULL, doc = NULL WHERE id = 6;
   UPDATE posts SET score = score + 10 WHERE author = 'bob';`,
  // Keys moved; other columns only; deletes.
  `UPDATE posts SET id = 30 WHERE id = 3;
   UPDATE posts SET id = 40, tags = '{z}' WHERE id = 4;
   UPDATE posts SET author = 'bob' WHERE id = 1;
   DELETE FROM posts WHERE id IN (2, 8);
   UPDATE authors SET region = 'apac' WHERE name = 'bob';`,
  // Multi-dimensional and non-1-based arrays expand as unnest expands them.
  `INSERT INTO posts VALUES (9, 'cy', '{{p,q},{r,s}}', '{"items": [[1, 2], {"sku": "w", "q": 3}]}', 1),
                            (10, 'cy', '[3:5]={u,v,w}', '{"items": ["a"]}', 2);
   UPDATE posts SET tags = array_remove(tags, 'a') WHERE id = 1;`,
  `DELETE FROM posts WHERE author = 'cy'; INSERT INTO authors VALUES ('dee', 'eu');`,
];

describe('CROSS JOIN LATERAL over unnest and jsonb_array_elements', () => {
  it('maintains projections and GROUP BY through writes, compared with the statement as written', async () => {
    for (const d of defs) {
      await live.trellis.apply(transformStatement(d));
      await waitForStatus(live.trellis, d.target, 'live');
    }
    await converged();
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await converged();
    }
  }, 300_000);

  it('stays exact under concurrent writers', async () => {
    const writer = async (w: number) => {
      for (let i = 0; i < 40; i++) {
        const id = 100 + w * 100 + (i % 10);
        const tags = Array.from({ length: (i * 7 + w) % 5 }, (_, k) => `t${(i + k * w) % 4}`);
        const doc = JSON.stringify({ items: tags.map((t, k) => ({ sku: t, q: k })) });
        const op = (i * 3 + w) % 4;
        if (op === 0) await live.db.sql`DELETE FROM posts WHERE id = ${id}`;
        else
          await live.db
            .sql`INSERT INTO posts VALUES (${id}, ${`w${w}`}, ${tags}, ${doc}::jsonb, ${i})
                            ON CONFLICT (id) DO UPDATE SET tags = EXCLUDED.tags, doc = EXCLUDED.doc,
                                                           score = EXCLUDED.score`;
      }
    };
    await Promise.all([1, 2, 3].map(writer));
    await converged();
  }, 180_000);

  it('shows the statement as written, which defines the same transform again', async () => {
    const shown = (await live.trellis.definitions()).find((d) => d.target === 'tag_counts');
    expect(shown?.statement).toBe(transformStatement(cases[4]!.def));
    await live.trellis.apply('DROP TRANSFORM tag_counts');
    await live.trellis.apply(shown!.statement);
    await waitForStatus(live.trellis, 'tag_counts', 'live');
    await live.db.sql`UPDATE posts SET tags = tags || '{new}'::text[] WHERE id % 2 = 0`;
    await converged();
  }, 120_000);

  it('explains a GROUP BY over it as a join keyed per element', async () => {
    const part = (await live.trellis.explain('tag_counts')).parts.at(-1);
    // Kept by delta through a key map row per element; no index to add (the table of
    // positions is read by its primary key).
    expect(part?.mode).toBe('delta');
    expect(part?.state.keyMap).toBe('groups');
    expect(part?.needs).toEqual([]);
    expect(part?.reads.map((r) => r.table)).toEqual(['public.posts', 'trellis.lateral_ordinals']);
  }, 60_000);

  it('quarantines a row whose array is longer than the table of positions, naming why', async () => {
    await live.db
      .sql`INSERT INTO posts (id, author, tags) SELECT 999, 'long', array_agg('x' || g) FROM generate_series(1, 100001) g`;
    await waitFor(
      async () => (await live.trellis.quarantineStatus('tag_rows')).count === 1,
      'the long row quarantined',
      60_000,
    );
    const held = await live.trellis.sampleQuarantined('tag_rows', { limit: 10 });
    expect(held.samples.map((x) => [x.key, x.sqlstate])).toEqual([['999', '54000']]);
    expect(held.samples[0]!.error).toContain('at most 100000 per row');
  }, 120_000);

  it('refuses what it cannot keep, by name, leaving nothing behind', async () => {
    await expectRefusedAs(
      live,
      'SELECT p.id, x.n FROM posts p CROSS JOIN LATERAL (SELECT count(*) AS n FROM authors a WHERE a.name = p.author) x',
      'a LATERAL subquery is not supported',
    );
    await expectRefusedAs(
      live,
      'SELECT p.id, g FROM posts p CROSS JOIN LATERAL generate_series(1, p.score) AS g',
      'CROSS JOIN LATERAL over generate_series is not supported',
    );
    await expectRefusedAs(
      live,
      'SELECT p.id, u.a, u.b FROM posts p CROSS JOIN LATERAL unnest(p.tags, p.tags) AS u(a, b)',
      'unnest of several arguments',
    );
    await expectRefusedAs(
      live,
      'SELECT p.id, j.key FROM posts p, LATERAL jsonb_each(p.doc) AS j',
      'LATERAL over jsonb_each is not supported',
    );
    await expectRefusedAs(
      live,
      'SELECT p.id, u.x FROM posts p RIGHT JOIN LATERAL unnest(p.tags) AS u(x) ON true',
      'a RIGHT or FULL JOIN LATERAL',
    );
  }, 60_000);
});
