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
});
