import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, linkChains } from './support/oracle.js';

// Trellis in a catalog schema of its own choosing (a name that needs quoting) and its
// targets in another schema than the sources': the oracle looks each target up in that
// schema (`targetSchema`), and recomputes a chain naming its upstream target by schema
// from the base tables.

const TARGETS = 'derived';

const live = livePipeline({
  schema: 'Trellis Catalog',
  targetSchema: TARGETS,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE SCHEMA ${TARGETS};
      CREATE TABLE os_customers (id int PRIMARY KEY, name text NOT NULL, region text);
      CREATE TABLE os_orders (id int PRIMARY KEY, customer_id int NOT NULL, amount numeric(10,2) NOT NULL);
      CREATE INDEX ON os_orders (customer_id);
      INSERT INTO os_customers SELECT g, 'c' || g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'r' || g % 4 END
        FROM generate_series(1, 40) g;
      INSERT INTO os_orders SELECT g, 1 + g % 40, (g % 17) * 1.25 FROM generate_series(1, 400) g;`);
  },
});

const D = linkChains({
  names: {
    target: 'os_names',
    from: 'os_customers',
    select: 'name, region',
    implicit: 'id',
  },
  joined: {
    target: 'os_joined',
    from: 'os_orders o JOIN os_customers c ON c.id = o.customer_id',
    select: 'o.amount, c.name',
    where: 'o.amount > 5',
    implicit: 'o.id AS id, c.id AS c_id',
  },
  totals: {
    target: 'os_totals',
    from: 'os_orders',
    select: 'customer_id, sum(amount) AS total, count(*) AS n',
    groupBy: 'customer_id',
  },
  // A chain over another target, named by its schema (linkChains links it all the same).
  big: {
    target: 'os_big',
    from: `${TARGETS}.os_totals t`,
    select: 't.customer_id, t.total',
    where: 't.n > 9',
  },
} satisfies Record<string, Definition>);

describe('a non-default catalog schema and target schema', () => {
  it('keeps targets in their own schema equal to their definitions, a chain over one too', async () => {
    const all = [D.names, D.joined, D.totals, D.big];
    await live.define(...all);
    const [where] = await live.db.sql<{ schemas: string[] }[]>`
      SELECT array_agg(DISTINCT n.nspname::text) AS schemas FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE c.relname IN ('os_names', 'os_joined', 'os_totals', 'os_big') AND c.relkind = 'r'`;
    expect(where?.schemas).toEqual([TARGETS]);
    const [catalog] = await live.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM "Trellis Catalog".transforms`;
    expect(catalog?.n).toBe(4);
    await live.converged(all, { targetSchema: TARGETS });
    await live.db.sql.unsafe(`
      UPDATE os_orders SET amount = amount + 3 WHERE id % 7 = 0;
      DELETE FROM os_orders WHERE id % 11 = 0;
      UPDATE os_customers SET name = upper(name), region = NULL WHERE id % 5 = 0;
      INSERT INTO os_orders SELECT g, 1 + g % 40, 9.75 FROM generate_series(401, 460) g;`);
    await live.converged(all, { targetSchema: TARGETS });
  });
});

describe('linkChains', () => {
  it('links the chain named by schema to its upstream', () => {
    expect(D.big).toMatchObject({ reads: [D.totals] });
  });
});
