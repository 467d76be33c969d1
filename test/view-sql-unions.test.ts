import { describe, expect, it } from 'vitest';
import { formatExplanation } from '../src/engine/catalog/explain.js';
import type { TrellisError } from '../src/engine/index.js';
import { trellisInProcess } from './support/cli.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { waitForStatus } from './support/trellis.js';
import { expectRefusedAs } from './support/view-sql-refusals.js';

// UNION ALL and UNION in a view's SQL (issue #26, ADR 0059): each branch is a hidden part
// mirrored into the union's table, which the transform (or the part a subquery makes)
// reads. Each target is compared with the statement as written, recomputed by Postgres
// (the oracle), after writes to every branch: rows in both branches (duplicates across
// branches for UNION), one of two duplicates deleted, keys, NULLs, a TRUNCATE.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE web_events (id int PRIMARY KEY, at timestamptz NOT NULL, user_id int, kind text);
      CREATE TABLE app_events (id bigint PRIMARY KEY, at timestamptz NOT NULL, user_id int, kind text);
      INSERT INTO web_events SELECT k, timestamptz '2026-01-01' + k * interval '1 hour', 1 + k % 5,
        CASE WHEN k % 4 = 0 THEN NULL ELSE 'kind' || k % 3 END FROM generate_series(1, 30) k;
      INSERT INTO app_events SELECT k, timestamptz '2026-01-02' + k * interval '1 hour', 1 + k % 7,
        CASE WHEN k % 5 = 0 THEN NULL ELSE 'kind' || k % 4 END FROM generate_series(1, 25) k;
      CREATE TABLE tags_a (id int PRIMARY KEY, tag text, grp int);
      CREATE TABLE tags_b (id int PRIMARY KEY, tag text, grp int);
      INSERT INTO tags_a VALUES (1, 'red', 1), (2, 'blue', 1), (3, NULL, 2), (4, 'red', 1), (5, 'green', NULL);
      INSERT INTO tags_b VALUES (1, 'red', 1), (2, 'pink', 3), (3, NULL, 2), (6, 'blue', 1), (7, 'green', NULL);`);
  },
});

// Two event tables combined. The target holds each branch's row once, identified by the
// branch (1, 2: the order written) and its row's key (as text): the oracle's query states
// those two columns the target adds, as it states a projection's implicit key.
const allEventsStatement = `TRANSFORM all_events AS
  SELECT id, at, user_id, 'web' AS src FROM web_events
  UNION ALL
  SELECT id, at, user_id, 'app' FROM app_events ORDER BY at`;
const allEvents: Definition = {
  target: 'all_events',
  select: 'u.id, u.at, u.user_id, u.src',
  from: `(SELECT id, at, user_id, 'web' AS src, 1 AS "trellis#branch", ROW(id)::text AS "trellis#key" FROM web_events
          UNION ALL
          SELECT id, at, user_id, 'app', 2, ROW(id)::text FROM app_events) u`,
  implicit: 'u."trellis#branch", u."trellis#key"',
};

// UNION: distinct over every column, NULLs equal, rows in both branches once.
const tagsUnion: Definition = {
  form: 'as',
  target: 'tags_union',
  select: 'tag, grp FROM tags_a UNION SELECT tag, grp',
  from: 'tags_b',
};

// An aggregate over a UNION ALL derived table.
const perSource: Definition = {
  form: 'as',
  target: 'events_per_source',
  select: 'e.src, count(*) AS n, count(e.user_id) AS users, max(e.at) AS latest',
  from: `(SELECT id, at, user_id, 'web' AS src FROM web_events
          UNION ALL SELECT id, at, user_id, 'app' FROM app_events) AS e`,
  groupBy: 'e.src',
};

// A UNION ALL as a WITH query, read by a GROUP BY of a nullable column.
const perKind: Definition = {
  form: 'as',
  target: 'events_per_kind',
  with: `ev AS (SELECT user_id, kind FROM web_events WHERE user_id <> 3
                UNION ALL SELECT user_id, kind FROM app_events)`,
  select: 'ev.kind, count(*) AS n, sum(ev.user_id) AS user_sum',
  from: 'ev',
  groupBy: 'ev.kind',
};

// A UNION in a derived table (its columns NOT NULL: the branches' keys), a grand total
// over it.
const distinctIds: Definition = {
  form: 'as',
  target: 'distinct_tag_ids',
  select: 'count(*) AS ids, max(x.id) AS top',
  from: '(SELECT id FROM tags_a UNION SELECT id FROM tags_b) AS x',
};

const defined = [tagsUnion, perSource, perKind, distinctIds];

const steps: string[] = [
  // Rows in both branches; duplicates across UNION's branches.
  `INSERT INTO web_events VALUES (31, '2026-03-01', 9, 'kind9'), (32, '2026-03-02', NULL, NULL);
   INSERT INTO app_events VALUES (26, '2026-03-01', 9, 'kind9'), (27, '2026-03-03', 2, 'kind1');
   INSERT INTO tags_a VALUES (8, 'pink', 3), (9, NULL, NULL);
   INSERT INTO tags_b VALUES (8, NULL, NULL), (9, 'red', 1);`,
  // One of two duplicates deleted (the row stays), then the other (it goes); keys move.
  `DELETE FROM tags_a WHERE id = 1;
   UPDATE tags_b SET id = 10 WHERE id = 6;
   UPDATE web_events SET id = 100 WHERE id = 1;
   UPDATE app_events SET id = 200 WHERE id = 2;`,
  `DELETE FROM tags_b WHERE id IN (1, 9);
   DELETE FROM tags_a WHERE id = 4;
   UPDATE tags_a SET tag = NULL WHERE id = 2;
   UPDATE tags_b SET grp = NULL, tag = 'green' WHERE id = 2;
   UPDATE web_events SET kind = NULL, user_id = 3 WHERE id BETWEEN 5 AND 9;
   UPDATE app_events SET at = at + interval '1 day', kind = 'kind0' WHERE id % 3 = 0;
   DELETE FROM web_events WHERE id BETWEEN 20 AND 25;`,
  // A branch's source emptied by TRUNCATE: its part is rebuilt, its rows leave the union's.
  `TRUNCATE app_events;
   INSERT INTO app_events VALUES (1, '2026-04-01', 1, 'kind1'), (2, '2026-04-02', NULL, NULL);
   DELETE FROM tags_a;`,
  `INSERT INTO tags_a VALUES (1, 'red', 1), (2, NULL, NULL), (3, 'green', NULL);
   UPDATE web_events SET user_id = NULL WHERE id % 2 = 0;`,
];

describe('UNION ALL and UNION', () => {
  it('maintains them through writes to every branch, compared with the statement as written', async () => {
    await live.trellis.apply(allEventsStatement);
    await waitForStatus(live.trellis, 'all_events', 'live');
    await live.define(...defined);
    const all = [allEvents, ...defined];
    await live.converged(all);
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await live.converged(all);
    }
  }, 240_000);

  it('keeps branches that aggregate', async () => {
    await live.trellis.apply(
      `TRANSFORM tag_counts AS SELECT tag, count(*) AS n FROM tags_a GROUP BY tag
         UNION ALL SELECT tag, count(*) FROM tags_b GROUP BY tag`,
    );
    await waitForStatus(live.trellis, 'tag_counts', 'live');
    const oracle: Definition = {
      target: 'tag_counts',
      select: 'u.tag, u.n',
      from: `(SELECT tag, count(*) AS n, 1 AS "trellis#branch", ROW(tag)::text AS "trellis#key" FROM tags_a GROUP BY tag
              UNION ALL SELECT tag, count(*), 2, ROW(tag)::text FROM tags_b GROUP BY tag) u`,
      implicit: 'u."trellis#branch", u."trellis#key"',
    };
    await live.converged(oracle);
    await live.db.sql.unsafe(`INSERT INTO tags_a VALUES (20, 'red', 1), (21, NULL, 1);
      DELETE FROM tags_b WHERE tag = 'green'; INSERT INTO tags_b VALUES (22, 'blue', 2)`);
    await live.converged(oracle);
  });

  it('shows one transform: the statement as written, its branches as parts', async () => {
    const defs = await live.trellis.definitions();
    expect(defs.map((d) => d.target).filter((t) => t.startsWith('trellis#'))).toEqual([]);
    const u = defs.find((d) => d.target === 'all_events');
    expect(u?.statement).toBe(
      "TRANSFORM all_events AS SELECT id, at, user_id, 'web' AS src FROM web_events UNION ALL SELECT id, at, user_id, 'app' FROM app_events",
    );
    expect(u?.parts?.map((p) => [p.name, p.target])).toEqual([
      ['1', 'trellis#all_events#1'],
      ['2', 'trellis#all_events#2'],
    ]);
    const k = defs.find((d) => d.target === 'events_per_kind');
    expect(k?.parts?.map((p) => p.name)).toEqual(['ev.1', 'ev.2', 'ev']);
    // The statement as recorded defines the same transform again.
    await live.trellis.apply('DROP TRANSFORM events_per_kind');
    await live.trellis.apply(k!.statement);
    const again = (await live.trellis.definitions()).find((d) => d.target === 'events_per_kind');
    expect(again?.statement).toBe(k?.statement);
    await live.converged(perKind);
  });

  it('refuses ADD COLUMN and DROP COLUMN on a union, changing nothing', async () => {
    for (const statement of [
      'ALTER TRANSFORM all_events ADD COLUMN upper(src) AS big',
      'ALTER TRANSFORM tags_union DROP COLUMN grp',
    ]) {
      const refused = await live.trellis.apply(statement).catch((e: unknown) => e);
      expect((refused as TrellisError).code).toBe('validation');
      expect((refused as TrellisError).message).toContain('is a UNION');
    }
    await live.converged([allEvents, tagsUnion]);
  });

  it('is not live while a branch is paused', async () => {
    await live.trellis.apply('PAUSE TRANSFORM "trellis#all_events#2"');
    expect((await live.trellis.status('all_events')).status).not.toBe('live');
    await live.trellis.apply('RESUME TRANSFORM "trellis#all_events#2"');
    await live.db.sql.unsafe(`INSERT INTO app_events VALUES (300, '2026-05-01', 4, 'kind2')`);
    await live.converged(allEvents);
    await waitForStatus(live.trellis, 'all_events', 'live');
  });

  it('explains how a transform is kept: its parts, the chain, each mode, the drain SQL', async () => {
    const e = await live.trellis.explain('events_per_source');
    expect(e.chain).toEqual([
      'trellis#events_per_source#e.1',
      'trellis#events_per_source#e.2',
      'trellis#events_per_source#e',
      'events_per_source',
    ]);
    expect(e.parts.map((p) => [p.name, p.mode])).toEqual([
      ['e.1', 're-derive'],
      ['e.2', 're-derive'],
      ['e', 're-derive'],
      [null, 'delta'],
    ]);
    // The part reading the union's table names the branches that write it.
    expect(e.parts[2]?.reads).toEqual([
      expect.objectContaining({
        table: 'public.trellis#events_per_source#e.union',
        writtenBy: ['trellis#events_per_source#e.1', 'trellis#events_per_source#e.2'],
      }),
    ]);
    expect(e.parts[0]?.reads[0]).toMatchObject({
      table: 'public.web_events',
      keyColumns: ['id'],
      indexes: [{ name: 'web_events_pkey', columns: ['id'] }],
    });
    for (const p of e.parts) expect(p.drainSql).toMatch(/^WITH changed AS MATERIALIZED/);
    const text = formatExplanation(e);
    expect(text).toContain('part e.1 (trellis#events_per_source#e.1):');
    expect(text).toContain('events_per_source (the transform):\n  maintenance: delta:');

    // A plain GROUP BY: one part, the transform; its source index gap and the fix.
    await live.db.sql.unsafe('CREATE TABLE visits (id int PRIMARY KEY, page text, ms int)');
    await live.trellis.apply(
      'TRANSFORM per_page AS SELECT page, count(*) AS n, max(ms) AS slowest FROM visits GROUP BY page',
    );
    await waitForStatus(live.trellis, 'per_page', 'live');
    const cli = await trellisInProcess(['explain', 'per_page'], { DATABASE_URL: live.db.url });
    expect(cli.code).toBe(0);
    expect(cli.stdout).toContain('per_page (the transform):');
    expect(cli.stdout).toMatch(/maintenance: delta: /);
    expect(cli.stdout).toContain('max(ms): delta+rescan');
    expect(cli.stdout).toContain('needs: CREATE INDEX CONCURRENTLY');
    expect(cli.stdout).toContain('drain SQL for changed keys ($1):');
    const json = await trellisInProcess(['explain', 'per_page', '--json'], {
      DATABASE_URL: live.db.url,
    });
    expect(JSON.parse(json.stdout)).toMatchObject({
      target: 'per_page',
      chain: ['per_page'],
      parts: [
        {
          name: null,
          mode: 'delta',
          key: ['page'],
          needs: [{ table: 'public.visits', columns: ['page'] }],
        },
      ],
    });
    const missing = await live.trellis.explain('nope').catch((error: unknown) => error);
    expect((missing as TrellisError).code).toBe('not_found');
    await live.trellis.apply('DROP TRANSFORM per_page');
  });

  const refusedStatements: Array<[string, string]> = [
    [
      'SELECT count(*) AS n FROM (SELECT tag FROM tags_a UNION SELECT tag FROM tags_b) x',
      'tag can be NULL',
    ],
    [
      'SELECT id, tag FROM tags_a UNION ALL SELECT id FROM tags_b',
      'each UNION query must have the same number of columns',
    ],
    [
      'SELECT id FROM tags_a UNION ALL SELECT tag FROM tags_b',
      'UNION types integer and text cannot be matched',
    ],
  ];
  it.each(refusedStatements)('refuses %s with validation naming it', async (select, named) => {
    await expectRefusedAs(live, select, named);
  });

  it('drops the branches and the union table with the transform', async () => {
    for (const t of [
      'all_events',
      'tags_union',
      'events_per_source',
      'events_per_kind',
      'distinct_tag_ids',
      'tag_counts',
    ]) {
      await live.trellis.apply(`DROP TRANSFORM ${t}`);
    }
    const left = await live.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_class WHERE relname LIKE 'trellis#%'`;
    expect(left[0]?.n).toBe(0);
    expect(await live.trellis.definitions()).toEqual([]);
  });
});
