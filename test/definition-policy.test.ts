import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, transformStatement } from './support/oracle.js';
import { rejection, waitFor } from './support/trellis.js';

// What a definition may read, and names the engine must never confuse with a user's
// (issue #8, ADR 0008): a change to anything the definition reads flows; what could not
// flow is refused when the transform is defined.

const live = livePipeline();

describe('what a definition reads', () => {
  it('writes to an INHERITS child flow into a transform over the parent, children created later too', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE vehicles (id int PRIMARY KEY, name text NOT NULL, wheels int NOT NULL);
      CREATE TABLE cars (doors int NOT NULL DEFAULT 4) INHERITS (vehicles);
      INSERT INTO vehicles VALUES (1, 'cart', 2);
      INSERT INTO cars VALUES (100, 'sedan', 4, 4);`);
    const d: Definition = {
      target: 'vehicle_names',
      from: 'vehicles',
      select: 'name, wheels',
      implicit: 'id',
    };
    await live.define(d);
    await live.converged([d]);
    await live.db.sql`INSERT INTO cars VALUES (101, 'coupe', 4, 2)`;
    await live.db.sql`UPDATE cars SET name = 'saloon' WHERE id = 100`;
    await live.db.sql`DELETE FROM vehicles WHERE id = 1`;
    await live.converged([d]);
    await live.db.sql.unsafe(`CREATE TABLE trucks () INHERITS (vehicles)`);
    // A child made later is captured by the staging worker's next pass: wait for it (its
    // capture trigger, or its place in the publication under WAL capture, and its row in
    // the source's members), so the insert below is captured, not only corrected.
    await waitFor(async () => {
      const [row] = await live.db.sql<{ captured: boolean }[]>`
        SELECT EXISTS (SELECT 1 FROM trellis.source_members WHERE relid = 'trucks'::regclass)
               AND (EXISTS (SELECT 1 FROM pg_trigger
                             WHERE tgrelid = 'trucks'::regclass AND tgname = 'trellis_capture_insert')
                    OR EXISTS (SELECT 1 FROM pg_publication_rel WHERE prrelid = 'trucks'::regclass))
                 AS captured`;
      return row?.captured === true;
    }, 'the staging worker to capture the new child trucks');
    await live.db.sql`INSERT INTO trucks VALUES (200, 'hauler', 18)`;
    await live.converged([d]);
  });

  it('refuses a STABLE function of the user (it may read other tables), accepts IMMUTABLE and built-in ones', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE rates (currency text PRIMARY KEY, rate numeric NOT NULL);
      INSERT INTO rates VALUES ('EUR', 1.1);
      CREATE TABLE prices (id int PRIMARY KEY, amount numeric NOT NULL, currency text NOT NULL,
                           at timestamptz NOT NULL DEFAULT '2026-01-01T10:00:00Z');
      INSERT INTO prices VALUES (1, 10, 'EUR'), (2, 20, 'EUR');
      CREATE FUNCTION to_usd(amount numeric, cur text) RETURNS numeric LANGUAGE sql STABLE
        AS $$ SELECT amount * (SELECT rate FROM rates WHERE currency = cur) $$;
      CREATE FUNCTION doubled(x numeric) RETURNS numeric LANGUAGE sql IMMUTABLE AS $$ SELECT x * 2 $$;`);
    const stable = await rejection(
      live.trellis.apply(
        transformStatement({
          target: 'usd_prices',
          from: 'prices',
          select: 'to_usd(amount, currency) AS usd',
        }),
      ),
    );
    expect(stable.code).toBe('validation');
    expect(stable.message).toContain('to_usd(numeric,text)');
    expect(stable.message).toContain('STABLE');
    const fine: Definition = {
      target: 'doubled_prices',
      from: 'prices',
      select: "doubled(amount) AS twice, date_trunc('day', at) AS day",
      implicit: 'id',
    };
    await live.define(fine);
    await live.converged([fine]);
    await live.db.sql`UPDATE prices SET amount = 11, at = '2026-02-03T04:05:06Z' WHERE id = 1`;
    await live.converged([fine]);
  });

  it('refuses a table alias in the engine\u2019s own name space', async () => {
    await live.db.sql.unsafe('CREATE TABLE plain (id int PRIMARY KEY, v int)');
    const refused = await rejection(
      live.trellis.apply('TRANSFORM reserved_alias FROM plain AS "trellis#g" SELECT v'),
    );
    expect(refused.code).toBe('validation');
    expect(refused.message).toContain('reserved');
  });
});

describe('names the engine uses in the SQL it generates', () => {
  it('aliases and columns named like the engine\u2019s own never change what a definition means', async () => {
    // Tables and columns named like the aliases, CTEs and columns of the re-derivation SQL.
    await live.db.sql.unsafe(`
      CREATE TABLE changed (id int PRIMARY KEY, g1 text, k1 int, key text, source_id int,
                            passes boolean, cat text NOT NULL, amount numeric NOT NULL);
      CREATE TABLE affected (id int PRIMARY KEY, k0_1 int, g1 text, groups text);
      INSERT INTO changed SELECT i, CASE WHEN i % 4 = 0 THEN NULL ELSE 'g' || (i % 3) END, i % 5,
                                 'k' || i, i % 2, i % 3 = 0, 'c' || (i % 4), i
        FROM generate_series(1, 120) i;
      INSERT INTO affected SELECT i, i % 7, 'a' || (i % 2), 'x' FROM generate_series(1, 40) i;`);
    const defs: Definition[] = [
      // GROUP BY over an alias named g, grouping by a nullable column named g1 (both once
      // captured by the engine's own names: 42703, then 21000 retried for ever).
      {
        target: 'grouped_g',
        from: 'changed AS g',
        select: 'g.cat AS cat, g1, count(*) AS n, sum(g.amount) AS total',
        groupBy: 'g.cat, g1',
      },
      {
        target: 'grouped_m',
        from: 'changed AS m LEFT JOIN affected AS c ON c.id = m.k1',
        select: 'c.g1 AS g1, count(*) AS n, sum(m.amount) AS total',
        where: 'm.passes IS NOT TRUE',
        groupBy: 'c.g1',
      },
      {
        target: 'joined_t',
        from: 'changed AS t JOIN affected AS d ON d.id = t.source_id + 1',
        select: 't.key AS key, d.groups AS groups, t.g1 AS g1',
        where: 't.k1 > 0',
        implicit: 't.id AS id, d.id AS d_id',
      },
      {
        target: 'projected_c',
        from: 'changed AS c',
        select: 'c.key, k1, source_id, passes',
        where: 'g1 IS NOT NULL',
        implicit: 'c.id AS id',
      },
    ];
    await live.define(...defs);
    await live.converged([...defs]);
    await live.db.sql.unsafe(`
      UPDATE changed SET g1 = NULL WHERE id % 5 = 0;
      UPDATE changed SET g1 = 'g9', cat = 'c9' WHERE id % 7 = 0;
      UPDATE changed SET k1 = k1 + 1, passes = NOT passes WHERE id % 3 = 0;
      UPDATE affected SET g1 = NULL WHERE id % 2 = 0;
      DELETE FROM affected WHERE id = 3;
      DELETE FROM changed WHERE id % 11 = 0;
      INSERT INTO changed SELECT i, NULL, 1, 'new', 1, false, 'c1', 1 FROM generate_series(500, 510) i;`);
    await live.converged([...defs]);
  });
});
