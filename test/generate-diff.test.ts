import { beforeAll, describe, expect, it } from 'vitest';
import { parseStatements } from '../src/cli/generate/check-statements.js';
import { type Ast, alterations, diffTransforms } from '../src/cli/generate/transform-diff.js';
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
  it('columns appended: ADD COLUMN; columns removed: DROP COLUMN; anything else: defined again', async () => {
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

  it('drops dependants first and defines upstream first; a chain over a target defined again is too', async () => {
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
        'DROP TRANSFORM "down"',
        'DROP TRANSFORM "up"',
        up2,
        down,
        fresh,
      ],
      summary: ['- gone', '± up', '± down', '+ fresh'],
      removed: ['gone'],
    });
  });
});
