import { describe, expect, it } from 'vitest';
import { BUILTIN_ARRAY_TYPES } from '../src/engine/db/array-types.js';
import { freshDatabase } from './support/database.js';

// Clients run with fetch_types: false (ADR 0007), so arrays are parsed and sent by the
// declared built-in array types. These tests hold the declarations to the server's catalog
// and round-trip awkward values through a real Postgres.

describe('built-in array types', () => {
  it('match the server catalog: every declared pair, and every built-in array type declared', async () => {
    const { sql } = await freshDatabase();
    const rows = await sql<{ elem: number; arr: number }[]>`
      SELECT t.oid::int AS elem, t.typarray::int AS arr FROM pg_type t
       WHERE t.typarray <> 0 AND t.oid < 10000 AND t.typtype IN ('b', 'r', 'm', 'p')
         AND t.typnamespace = 'pg_catalog'::regnamespace
       ORDER BY t.oid`;
    const declared = new Map(BUILTIN_ARRAY_TYPES.map(([e, a]) => [e, a]));
    const server = new Map(rows.map((r) => [r.elem, r.arr]));
    // Every declared pair is what the server says (a wrong OID would mis-parse silently).
    for (const [elem, arr] of declared) {
      if (server.has(elem)) expect({ elem, arr }).toEqual({ elem, arr: server.get(elem) });
    }
    // Types the server has that we do not declare would come back as text: there are none
    // among the built-in base, range and multirange types.
    const missing = [...server.keys()].filter((elem) => !declared.has(elem));
    expect(missing).toEqual([]);
  });

  it('parses what Postgres prints: quotes, backslashes, NULL and "NULL", nesting, bounds', async () => {
    const { sql } = await freshDatabase();
    const [row] = await sql.unsafe(`
      SELECT ARRAY['a', 'b c', '', NULL, 'NULL', 'q"uote', 'back\\slash', '{x,y}', ' pad ']::text[] AS texts,
             ARRAY[[1, 2], [3, NULL]]::int[] AS ints,
             ARRAY[9007199254740993, -1]::int8[] AS bigs,
             ARRAY[1.50, -0.0]::numeric[] AS nums,
             ARRAY[true, false, NULL]::bool[] AS bools,
             '[0:1]={7,8}'::int[] AS bounded,
             '{}'::text[] AS empty,
             ARRAY['{"a": [1, "x,y"]}'::jsonb, 'null'::jsonb] AS docs,
             ARRAY['2026-01-02T03:04:05Z'::timestamptz] AS times,
             ARRAY['\\x00ff'::bytea] AS bytes,
             ARRAY['(0,0),(1,1)'::box, '(2,2),(3,3)'::box] AS boxes`);
    expect(row).toEqual({
      texts: ['a', 'b c', '', null, 'NULL', 'q"uote', 'back\\slash', '{x,y}', ' pad '],
      ints: [
        [1, 2],
        [3, null],
      ],
      bigs: ['9007199254740993', '-1'],
      nums: ['1.50', '0.0'],
      bools: [true, false, null],
      bounded: [7, 8],
      empty: [],
      docs: [{ a: [1, 'x,y'] }, null],
      times: [new Date('2026-01-02T03:04:05Z')],
      bytes: [Buffer.from([0, 255])],
      boxes: ['(1,1),(0,0)', '(3,3),(2,2)'],
    });
  });

  it('sends arrays as parameters that Postgres reads back unchanged', async () => {
    const { sql } = await freshDatabase();
    const texts = ['a', 'b c', '', null, 'NULL', 'q"uote', 'back\\slash', '{x,y}', ' pad ', 'é'];
    const [row] = await sql.unsafe(
      `SELECT $1::text[] AS texts, cardinality($1::text[]) AS n, ($1::text[])[4] IS NULL AS fourth_null,
              $2::int8[] AS bigs, $3::jsonb[] AS docs, $4::int[] AS nested`,
      [texts, ['1', '-9007199254740993'], [{ k: 'v"' }, [1, 2]], [[1], [2]]] as never[],
    );
    expect(row).toEqual({
      texts,
      n: texts.length,
      fourth_null: true,
      bigs: ['1', '-9007199254740993'],
      docs: [{ k: 'v"' }, [1, 2]],
      nested: [[1], [2]],
    });
  });
});
