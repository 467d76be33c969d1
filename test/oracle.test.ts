import { describe, expect, it } from 'vitest';
import { freshDatabase } from './support/database.js';
import { compareWithDefinition, type Definition } from './support/oracle.js';

// The oracle must catch what it claims to catch: tables made by hand stand in for targets.
describe('the oracle', () => {
  const def: Definition = { target: 'fake_target', from: 'src', select: 'v, f', implicit: 'id' };

  it('passes a table equal to its definition, and catches each kind of difference', async () => {
    const { sql } = await freshDatabase();
    await sql.unsafe(`
      CREATE TABLE src (id int PRIMARY KEY, v numeric, f float8);
      INSERT INTO src VALUES (1, 1.0, 0.1), (2, NULL, 1e300), (3, 3, '-0'), (4, 3, '-0');
      CREATE TABLE fake_target (v numeric, f float8, id int PRIMARY KEY);
      INSERT INTO fake_target SELECT v, f, id FROM src;`);
    expect(await compareWithDefinition(sql, def)).toMatchObject({
      missing: [],
      extra: [],
      strayColumns: [],
      missingColumns: [],
      hasKey: true,
    });

    // Numeric scale counts: 1.0 is not 1.00.
    await sql`UPDATE fake_target SET v = 1.00 WHERE id = 1`;
    const scaled = await compareWithDefinition(sql, def);
    expect(scaled.missing).toEqual([{ v: '1.0', f: '0.1', id: '1' }]);
    expect(scaled.extra).toEqual([{ v: '1.00', f: '0.1', id: '1' }]);
    await sql`UPDATE fake_target SET v = 1.0 WHERE id = 1`;

    // NULL is only NULL; a duplicate row counts twice (multisets).
    await sql`UPDATE fake_target SET v = 0 WHERE id = 2`;
    expect((await compareWithDefinition(sql, def)).extra).toHaveLength(1);
    await sql`UPDATE fake_target SET v = NULL WHERE id = 2`;
    await sql`DELETE FROM fake_target WHERE id = 4`;
    expect((await compareWithDefinition(sql, def)).missing).toEqual([{ v: '3', f: '-0', id: '4' }]);
    await sql`INSERT INTO fake_target VALUES (3, '-0', 4)`;

    // Floats within the tolerance pass; beyond it, or compared exactly, they do not.
    await sql`UPDATE fake_target SET f = f * (1 + 1e-12) WHERE id = 2`;
    expect((await compareWithDefinition(sql, def)).extra).toEqual([]);
    expect((await compareWithDefinition(sql, def, { floatTolerance: 0 })).extra).toHaveLength(1);
    await sql`UPDATE fake_target SET f = f * (1 + 1e-6) WHERE id = 2`;
    expect((await compareWithDefinition(sql, def)).extra).toHaveLength(1);
    await sql`UPDATE fake_target SET f = 1e300 WHERE id = 2`;

    // A stray or missing column, and a lost key.
    await sql`ALTER TABLE fake_target ADD COLUMN stray int`;
    expect((await compareWithDefinition(sql, def)).strayColumns).toEqual(['stray']);
    await sql`ALTER TABLE fake_target DROP COLUMN stray, DROP COLUMN f`;
    expect((await compareWithDefinition(sql, def)).missingColumns).toEqual(['f']);
    await sql`ALTER TABLE fake_target DROP CONSTRAINT fake_target_pkey`;
    expect((await compareWithDefinition(sql, def)).hasKey).toBe(false);
  });

  it('compares column types, checks the key exactly, and recomputes a chain from the base tables', async () => {
    const { sql } = await freshDatabase();
    await sql.unsafe(`
      CREATE TABLE src (id int PRIMARY KEY, v numeric(12,2), f float8, g int);
      INSERT INTO src VALUES (1, 1.50, 0.5, 1), (2, 2.25, 1.5, 1), (3, NULL, 2.5, 2);
      CREATE TABLE fake_target (v numeric(12,2), f float8, id int PRIMARY KEY);
      INSERT INTO fake_target SELECT v, f, id FROM src;`);
    expect(await compareWithDefinition(sql, def)).toMatchObject({
      typeMismatches: [],
      hasKey: true,
      key: ['id'],
    });
    // The same text in a column of another type (or typmod) is not the same column.
    await sql`ALTER TABLE fake_target ALTER COLUMN v TYPE numeric`;
    expect((await compareWithDefinition(sql, def)).typeMismatches).toEqual([
      'v: numeric != numeric(12,2)',
    ]);
    await sql`ALTER TABLE fake_target ALTER COLUMN v TYPE numeric(12,2)`;

    // The key, not any unique index: a partial one, or one on a nullable column without
    // NULLS NOT DISTINCT, is none.
    await sql`ALTER TABLE fake_target DROP CONSTRAINT fake_target_pkey`;
    await sql`CREATE UNIQUE INDEX fake_partial ON fake_target (id) WHERE id > 0`;
    await sql`CREATE UNIQUE INDEX fake_nullable ON fake_target (v)`;
    expect(await compareWithDefinition(sql, def)).toMatchObject({ hasKey: false, key: null });
    await sql`DROP INDEX fake_partial, fake_nullable`;
    // A key on the wrong columns: not the one the test names, or not unique over the
    // definition's rows.
    await sql`ALTER TABLE fake_target ADD PRIMARY KEY (f)`;
    expect(await compareWithDefinition(sql, { ...def, key: ['id'] })).toMatchObject({
      hasKey: false,
      key: ['f'],
    });
    await sql`UPDATE src SET f = 0.5`;
    await sql`ALTER TABLE fake_target DROP CONSTRAINT fake_target_pkey`;
    await sql`UPDATE fake_target SET f = id`;
    await sql`ALTER TABLE fake_target ADD PRIMARY KEY (f)`;
    expect((await compareWithDefinition(sql, def)).hasKey).toBe(false);

    // A chain is compared with its definition over the base tables: an upstream target
    // that is wrong does not make a wrong chain look right.
    await sql.unsafe(`
      CREATE TABLE up_target (g int PRIMARY KEY, n bigint);
      INSERT INTO up_target VALUES (1, 2), (2, 1);
      CREATE TABLE chain_target (g int PRIMARY KEY, twice bigint);
      INSERT INTO chain_target VALUES (1, 4), (2, 2);`);
    const up: Definition = {
      target: 'up_target',
      from: 'src',
      select: 'g, count(*) AS n',
      groupBy: 'g',
    };
    const chain: Definition = {
      target: 'chain_target',
      from: 'up_target u',
      select: 'u.g, u.n * 2 AS twice',
      reads: [up],
    };
    expect(await compareWithDefinition(sql, chain)).toMatchObject({ missing: [], extra: [] });
    // Upstream and chain both wrong, and agreeing with each other: the chain still differs.
    await sql`UPDATE up_target SET n = 5 WHERE g = 1`;
    await sql`UPDATE chain_target SET twice = 10 WHERE g = 1`;
    expect((await compareWithDefinition(sql, up)).extra).toEqual([{ g: '1', n: '5' }]);
    expect((await compareWithDefinition(sql, chain)).extra).toEqual([{ g: '1', twice: '10' }]);
  });
});
