import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, transformStatement } from './support/oracle.js';
import { waitForStatus } from './support/trellis.js';

/**
 * Builds at CREATE TABLE AS speed (issue #22 item 3, ADR 0050): a GROUP BY kept by delta
 * is built as its key map from the sources, its group states folded from the key map, and
 * its target from the states; and a build's tables are sized by the index builds that end
 * it, with statistics gathered only where the drain looks rows up by a column that is not
 * unique. Every target is compared with its definition run by Postgres.
 */
const live = livePipeline();

/** The target, key map and group states of `target`, with the rows each holds. */
async function builtTables(target: string) {
  return live.db.sql<{ rel: string; reltuples: number; rows: number; unanalysed: string[] }[]>`
    WITH t AS (SELECT id, target_oid FROM trellis.transforms WHERE target_name = ${target}),
    rels AS (
      SELECT target_oid AS oid FROM t
      UNION ALL SELECT to_regclass(format('trellis.map_%s', id))::oid FROM t
      UNION ALL SELECT to_regclass(format('trellis.groups_%s', id))::oid FROM t)
    SELECT c.oid::regclass::text AS rel, c.reltuples::float8 AS reltuples,
           (xpath('/row/n/text()',
                  query_to_xml(format('SELECT count(*) AS n FROM %s', c.oid::regclass), false, true, '')))[1]::text::float8 AS rows,
           -- Columns of indexes that are not unique, without statistics.
           ARRAY(SELECT a.attname::text
                   FROM pg_index i JOIN pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
                  WHERE i.indrelid = c.oid AND NOT i.indisunique
                    AND NOT EXISTS (SELECT 1 FROM pg_stats s
                                     WHERE s.schemaname = n.nspname AND s.tablename = c.relname
                                       AND s.attname = a.attname)) AS unanalysed
      FROM rels JOIN pg_class c ON c.oid = rels.oid JOIN pg_namespace n ON n.oid = c.relnamespace`;
}

const TOTALS: Definition = {
  target: 'bs_totals',
  from: 'bs_items',
  select: 'g, count(*) AS n, sum(v) AS total, avg(q) AS mean, min(q) AS low',
  where: 'q IS DISTINCT FROM 13',
  groupBy: 'g',
  having: 'count(*) > 1',
};
/** Recomputed by group (a DISTINCT aggregate): target and key map in one statement. */
const KINDS: Definition = {
  target: 'bs_kinds',
  from: 'bs_items',
  select: 'g, count(DISTINCT q) AS kinds, sum(v) AS total',
  groupBy: 'g',
};
/** A grand total recomputed whole: no key map. */
const OVERALL: Definition = {
  target: 'bs_overall',
  from: 'bs_items',
  select: 'count(DISTINCT g) AS groups, count(*) AS n',
};
const PROJECTED: Definition = {
  target: 'bs_projected',
  from: 'bs_items',
  select: 'g, v * 2 AS doubled',
  implicit: 'id',
};

describe('a build at CREATE TABLE AS speed', () => {
  it('builds a GROUP BY kept by delta and a projection sized by their index builds, with statistics for the key map', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE bs_items (id int PRIMARY KEY, g int, v numeric, q int);
      INSERT INTO bs_items
        SELECT i, CASE WHEN i % 97 = 0 THEN NULL ELSE i % 1500 END,
               CASE i % 3 WHEN 0 THEN 1.0 WHEN 1 THEN 1.00 ELSE NULL END * i, i % 17
          FROM generate_series(1, 30000) i;
      ANALYZE bs_items;`);
    await live.define(TOTALS, KINDS, OVERALL, PROJECTED);
    await live.converged([TOTALS, KINDS, OVERALL, PROJECTED]);
    expect(
      (await live.trellis.definitions()).find((d) => d.target === TOTALS.target)?.maintenance,
    ).toMatchObject({ mode: 'delta' });
    const tablesOf = {
      [TOTALS.target]: 3,
      [KINDS.target]: 2,
      [OVERALL.target]: 1,
      [PROJECTED.target]: 1,
    };
    for (const [target, count] of Object.entries(tablesOf)) {
      const tables = await builtTables(target);
      expect(tables.length, target).toBe(count);
      for (const t of tables) {
        // Every table's size is known (no table taken for the empty one it was), and every
        // column the drain looks rows up by without a unique index has statistics.
        expect({ rel: t.rel, reltuples: t.reltuples }).toEqual({ rel: t.rel, reltuples: t.rows });
        expect({ rel: t.rel, unanalysed: t.unanalysed }).toEqual({ rel: t.rel, unanalysed: [] });
      }
    }
    // Kept current from there, by delta.
    await live.db.sql.unsafe(`
      UPDATE bs_items SET g = g + 1 WHERE id % 11 = 0;
      UPDATE bs_items SET q = 13 WHERE id % 23 = 0;
      DELETE FROM bs_items WHERE id % 31 = 0;
      INSERT INTO bs_items SELECT i, i % 7, 2.50, NULL FROM generate_series(40001, 40100) i;`);
    await live.converged([TOTALS, KINDS, OVERALL, PROJECTED]);
  });

  it('builds a GROUP BY kept by delta while writers move rows between groups, and it equals its definition', async () => {
    const d: Definition = { ...TOTALS, target: 'bs_busy' };
    await live.trellis.apply(transformStatement(d));
    // Writes while it builds: the key map is read from the sources once, the states and the
    // target from the key map, and what changed after the build's start tick comes through
    // the ledger.
    for (let i = 0; i < 5; i++) {
      await live.db.sql.unsafe(`
        UPDATE bs_items SET g = coalesce(g, 0) + ${i + 1}, v = v + 0.5 WHERE id % ${13 + i} = 0;
        DELETE FROM bs_items WHERE id % ${101 + i} = 0;
        INSERT INTO bs_items SELECT i, i % 9, 3.25, ${i} FROM generate_series(${50000 + i * 100}, ${50000 + i * 100 + 49}) i;`);
    }
    await waitForStatus(live.trellis, d.target, 'live');
    await live.converged(d);
  });

  it('rebuilds a target another transform reads (its key kept) and analyses it in full', async () => {
    const reader: Definition = {
      target: 'bs_reader',
      from: 'bs_projected',
      select: 'g, count(*) AS n',
      groupBy: 'g',
      reads: [PROJECTED],
    };
    await live.define(reader);
    await live.trellis.requestBackfill(PROJECTED.target);
    await waitForStatus(live.trellis, PROJECTED.target, 'live');
    await live.db.sql`UPDATE bs_items SET g = g + 2 WHERE id % 19 = 0`;
    await live.converged([PROJECTED, reader]);
    const [analysed] = await live.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_stats WHERE schemaname = 'public' AND tablename = 'bs_projected'`;
    // Every column of the target (id, g, doubled): its key was not built again, so its size
    // and statistics came from a full ANALYZE.
    expect(analysed?.n).toBe(3);
  });
});
