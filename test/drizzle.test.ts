import { describe, expect, it } from 'vitest';
import { applyStatementSql } from '../src/drizzle/index.js';
import { installSql } from '../src/migration/index.js';
import { freshDatabase } from './support/database.js';

describe('applyStatementSql', () => {
  it('quotes the schema as an identifier and the statement as a literal', () => {
    expect(applyStatementSql("TRANSFORM t FROM s SELECT 'it''s' AS x")).toBe(
      `SELECT "trellis".apply('TRANSFORM t FROM s SELECT ''it''''s'' AS x');`,
    );
    expect(applyStatementSql('DROP TRANSFORM t', { schema: 'my "cat"' })).toBe(
      `SELECT "my ""cat""".apply('DROP TRANSFORM t');`,
    );
    expect(() => applyStatementSql('DROP TRANSFORM t', { schema: '' })).toThrow(/schema/);
  });

  it('defines a transform inside a migration transaction, after the install SQL', async () => {
    const db = await freshDatabase();
    // What a drizzle-kit custom migration holds: Trellis's schema, app DDL, a statement.
    await db.sql.begin(async (tx) => {
      await tx.unsafe(installSql({ schema: 'tr' }));
      await tx.unsafe('CREATE TABLE widgets (id int PRIMARY KEY, price numeric)');
      await tx.unsafe(
        applyStatementSql('TRANSFORM widget_prices FROM widgets SELECT price AS price', {
          schema: 'tr',
        }),
      );
    });
    const rows = await db.sql`SELECT target_name FROM tr.transforms`;
    expect(rows.map((r) => r.target_name)).toEqual(['widget_prices']);
    const [target] = await db.sql`SELECT to_regclass('public.widget_prices') IS NOT NULL AS ok`;
    expect(target?.ok).toBe(true);
  });

  it('fails the migration on a refused statement, leaving nothing behind', async () => {
    const db = await freshDatabase();
    const failed = await db.sql
      .begin(async (tx) => {
        await tx.unsafe(installSql());
        await tx.unsafe('CREATE TABLE keyless (a int)');
        await tx.unsafe(applyStatementSql('TRANSFORM k FROM keyless SELECT a AS a'));
      })
      .catch((e: unknown) => e);
    expect((failed as { code?: string }).code).toBe('TRV01');
    const [row] =
      await db.sql`SELECT to_regnamespace('trellis') AS ns, to_regclass('keyless') AS t`;
    expect(row).toEqual({ ns: null, t: null });
  });
});
