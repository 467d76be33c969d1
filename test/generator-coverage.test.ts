import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { caseArb, caseConstructs } from './support/differential-case.js';
import { COLUMN_TYPES } from './support/random-values.js';

// The differential tests' generator (test/support/random-*.ts) makes every construct of
// the grammar README documents, and the writes the engine must follow: cases drawn from
// fixed seeds, with the sizes `npm test` runs, must between them make each construct
// named below. A construct the grammar gains goes in the generator and in this list;
// one the generator stops making (a change of weights, a template lost) fails here.

const SIZES = { tables: 3, rows: 8, transforms: 3, writers: 3, steps: 12 };

/** Every construct the generator makes (`caseConstructs`). */
const CONSTRUCTS = [
  // Transforms (README, Transforms).
  'rows',
  'groups',
  'total',
  'SELECT DISTINCT',
  'JOIN',
  'LEFT JOIN',
  'three tables or more',
  'four tables or more',
  'self-join',
  'join on values',
  'ON with a predicate',
  'ON comparing two columns',
  'ON of three conditions or more',
  'anti-join',
  'WHERE',
  'WHERE of two conditions or more',
  'WHERE with OR',
  'WHERE comparing two columns',
  'expression of two columns',
  'expression of two tables',
  'HAVING',
  'delta aggregates',
  'delta aggregate with FILTER',
  'delta HAVING',
  'delta sum of numerics',
  'implicit key columns',
  'chain',
  'chain joined with a table',
  'chain of a chain',
  'WITHOUT SOURCE INDEX',
  'AS form',
  'AS form with ORDER BY',
  // View SQL (README, Transforms: subqueries in FROM and WITH, semi- and anti-joins,
  // scalar subqueries, UNION ALL and UNION).
  'view SQL',
  'derived table',
  'WITH query',
  'subquery of a GROUP BY',
  'subquery of a projection',
  'subquery joined with a table',
  'UNION ALL in a subquery',
  'UNION in a subquery',
  'UNION',
  'UNION ALL',
  'EXISTS',
  'NOT EXISTS',
  'IN (SELECT …)',
  '= ANY (SELECT …)',
  'NOT IN (SELECT …)',
  '<> ALL (SELECT …)',
  'scalar subquery in WHERE',
  'scalar subquery in SELECT',
  'scalar subquery in HAVING',
  'correlated scalar subquery',
  // DISTINCT ON and top-N per partition (ADR 0065), RIGHT and FULL joins (ADR 0066), NOT
  // IN or <> ALL over nullable values and subquery predicates under OR (ADR 0057's addendum).
  'DISTINCT ON',
  'top-N by row_number()',
  'top-N by rank()',
  'top-N by dense_rank()',
  'RIGHT JOIN',
  'FULL JOIN',
  'NOT IN over NULLs',
  'subquery predicate under OR',
  // CROSS JOIN LATERAL over a row's array or jsonb (ADR 0071); INTERSECT, EXCEPT, their ALL
  // forms and set operators of several kinds with brackets, at the top and in a subquery or
  // WITH query read by an aggregate (ADR 0072, 0073); top-N over a subquery or WITH query,
  // RIGHT and FULL joins after a LEFT JOIN (ADR 0073).
  'CROSS JOIN LATERAL unnest',
  'CROSS JOIN LATERAL jsonb_array_elements',
  'LATERAL WITH ORDINALITY',
  'LATERAL under an aggregate',
  'LATERAL under DISTINCT',
  'INTERSECT',
  'EXCEPT',
  'UNION and INTERSECT',
  'EXCEPT of a bracketed INTERSECT ALL',
  'UNION ALL then EXCEPT',
  'INTERSECT of a bracketed EXCEPT ALL',
  'set operators of three branches',
  'INTERSECT in a subquery',
  'INTERSECT ALL in a subquery',
  'EXCEPT in a subquery',
  'EXCEPT ALL in a subquery',
  'mixed set operators in a subquery',
  'refused: an array column in a set operation',
  'top-N of a GROUP BY subquery',
  'top-N of a projection subquery',
  'top-N over a subquery',
  'top-N over a WITH query',
  'RIGHT JOIN after a LEFT JOIN',
  'FULL JOIN after a LEFT JOIN',
  // Tables named with quotes, or in a schema of their own.
  'tables named quoted',
  'tables named schema',
  // Source DDL the engine follows, between the writers' runs.
  'DDL: ADD COLUMN',
  'DDL: CREATE INDEX',
  'DDL: DROP COLUMN',
  'DDL: int to bigint',
  'DDL: numeric(12,2) to numeric',
  'DDL: RENAME COLUMN',
  // Every column type (test/support/random-values.ts).
  ...COLUMN_TYPES.map((type) => `${type} column`),
  // Writes.
  'COPY',
  'MERGE',
  'MERGE deleting',
  'MERGE inserting',
];

/** The seeds drawn from, and the cases from each. */
const SEEDS = [1, 2, 3, 4];
const CASES = 100;

describe('the differential generator', () => {
  it('makes every construct of the grammar, and every kind of write, across fixed seeds', () => {
    const counts = new Map<string, number>();
    for (const seed of SEEDS) {
      const cases = fc.sample(caseArb(SIZES), { seed, numRuns: CASES });
      for (const c of cases) {
        for (const k of caseConstructs(c)) counts.set(k, (counts.get(k) ?? 0) + 1);
      }
    }
    console.log(
      `[generator] cases making each construct, of ${SEEDS.length * CASES}: ${JSON.stringify(Object.fromEntries([...counts].sort()))}`,
    );
    const missing = CONSTRUCTS.filter((k) => !counts.has(k));
    expect(missing).toEqual([]);
    // Every construct the generator names is listed here (so the list grows with it).
    const unlisted = [...counts.keys()].filter((k) => !CONSTRUCTS.includes(k));
    expect(unlisted).toEqual([]);
  });
});
