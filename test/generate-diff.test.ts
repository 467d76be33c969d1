import { beforeAll, describe, expect, it } from 'vitest';
import { parseStatements } from '../src/cli/generate/check-statements.js';
import {
  type Ast,
  alterations,
  diffTransforms,
  redefinition,
} from '../src/cli/generate/transform-diff.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

// What `trellis generate transform --from` writes for each kind of change (ADR 0048), with
// statements parsed by the grammar itself (parse_statement, on a real database). The
// end-to-end run through drizzle-kit is in generate.test.ts.

let db: TestDatabase;

beforeAll(async () => {
  db = await freshDatabase();
});

async function parse(...statements: string[]): Promise<Map<string, Ast>> {
  const trees = await parseStatements({
    url: db.url,
    schema: 'trellis',
    targetSchema: 'public',
    statements,
  });
  return new Map(statements.map((s, i) => [s, trees[i] as Ast]));
}

const V1 =
  'TRANSFORM "t" FROM "o" SELECT "o"."a" AS "a", "o"."b" AS "b", "o"."c" AS "c" WHERE "o"."a" > 1';

describe('what a changed statement becomes', () => {
  it('columns appended: ADD COLUMN; columns removed: DROP COLUMN; anything else: no column ALTER says it', async () => {
    const cases: Array<[string, string[] | null]> = [
      [
        'TRANSFORM "t" FROM "o" SELECT "o"."a" AS "a", "o"."b" AS "b", "o"."c" AS "c", "o"."d" + 1 AS "d" WHERE "o"."a" > 1',
        ['ALTER TRANSFORM "t" ADD COLUMN "o"."d" + 1 AS "d"'],
      ],
      [
        'TRANSFORM "t" FROM "o" SELECT "o"."a" AS "a", "o"."c" AS "c" WHERE "o"."a" > 1',
        ['ALTER TRANSFORM "t" DROP COLUMN "b"'],
      ],
      // The same statement, laid out otherwise: nothing to write.
      [
        'TRANSFORM "t"\nFROM "o"\nSELECT "o"."a" AS "a",  "o"."b" AS "b", "o"."c" AS "c"\nWHERE "o"."a" > 1',
        [],
      ],
      [
        'TRANSFORM "t" FROM "o" SELECT "o"."b" AS "b", "o"."a" AS "a", "o"."c" AS "c" WHERE "o"."a" > 1',
        null,
      ],
      [
        'TRANSFORM "t" FROM "o" SELECT "o"."a" AS "a", "o"."b" AS "b", "o"."c" AS "c" WHERE "o"."a" > 2',
        null,
      ],
      [
        'TRANSFORM "t" FROM "o" SELECT "o"."a" AS "a", "o"."b" AS "x", "o"."c" AS "c" WHERE "o"."a" > 1',
        null,
      ],
    ];
    const trees = await parse(V1, ...cases.map(([s]) => s));
    for (const [statement, expected] of cases) {
      expect(alterations('t', trees.get(V1) as Ast, trees.get(statement) as Ast)).toEqual(expected);
    }
  });

  it('anything else: redefined in place (ALTER TRANSFORM … AS), the statement as written', async () => {
    expect(redefinition('TRANSFORM "t" FROM "o" SELECT "o"."a" AS "a" WHERE "o"."a" > 2')).toBe(
      'ALTER TRANSFORM "t" AS FROM "o" SELECT "o"."a" AS "a" WHERE "o"."a" > 2',
    );
    // Line breaks kept, as written: the snapshot made from migrations gives the statement back.
    expect(redefinition('transform  public.t\n  AS SELECT a FROM o')).toBe(
      'ALTER TRANSFORM public.t\n  AS SELECT a FROM o',
    );
    expect(redefinition('TRANSFORM "t"\nFROM "o"\nSELECT "o"."a" AS "a"')).toBe(
      'ALTER TRANSFORM "t" AS\nFROM "o"\nSELECT "o"."a" AS "a"',
    );
    expect(redefinition('TRANSFORM "a ""b""" AS SELECT 1 AS x FROM o')).toBe(
      'ALTER TRANSFORM "a ""b""" AS SELECT 1 AS x FROM o',
    );
    // Each is a statement the grammar reads as the redefinition it is.
    const statements = [
      'ALTER TRANSFORM "t" AS FROM "o" SELECT "o"."a" AS "a" WHERE "o"."a" > 2',
      'ALTER TRANSFORM public.t AS SELECT a FROM o',
    ];
    const trees = await parse(...statements);
    expect(trees.get(statements[0]!)).toMatchObject({
      kind: 'redefine',
      transform: 't',
      definition: { kind: 'transform', target: { name: 't' }, where: '"o"."a" > 2' },
    });
    expect(trees.get(statements[1]!)).toMatchObject({
      kind: 'redefine',
      transform: 't',
      schema: 'public',
      definition: { kind: 'transform', form: 'as', select: [{ expr: 'a' }] },
    });
  });

  it('drops dependants first and defines upstream first; a chain over a redefined target follows it', async () => {
    const up1 = 'TRANSFORM "up" FROM "o" SELECT "o"."a" AS "a" WHERE "o"."a" > 1';
    const up2 = 'TRANSFORM "up" FROM "o" SELECT "o"."a" AS "a" WHERE "o"."a" > 2';
    const down = 'TRANSFORM "down" FROM "up" SELECT "up"."a" AS "a"';
    const gone = 'TRANSFORM "gone" FROM "o" SELECT "o"."b" AS "b"';
    const fresh = 'TRANSFORM "fresh" FROM "up" SELECT count(*) AS "n"';
    // A snapshot made from migrations holds no reads: the parse trees give them.
    const previous = {
      down: { statement: down, reads: [] },
      gone: { statement: gone, reads: [] },
      up: { statement: up1, reads: [] },
    };
    const declared = [
      { target: 'up', statement: up2, reads: [] },
      { target: 'fresh', statement: fresh, reads: ['up'] },
      { target: 'down', statement: down, reads: ['up'] },
    ];
    const parsed = await parse(up1, up2, down, gone, fresh);
    expect(() => diffTransforms({ declared, previous, parsed, allowDrop: false })).toThrow(
      'the schema file no longer declares gone: pass --allow-drop to write DROP TRANSFORM for it (the target is dropped, rows and all)',
    );
    expect(diffTransforms({ declared, previous, parsed, allowDrop: true })).toEqual({
      statements: [
        'DROP TRANSFORM "gone"',
        'ALTER TRANSFORM "up" AS FROM "o" SELECT "o"."a" AS "a" WHERE "o"."a" > 2',
        fresh,
      ],
      summary: ['- gone', '± up', '+ fresh'],
      removed: ['gone'],
    });
  });
});
