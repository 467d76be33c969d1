import { expect } from 'vitest';
import type { LivePipeline } from './live.js';

/**
 * A target whose rows are copies (a set operation kept by counts, ADR 0073): its columns,
 * and the statement Postgres runs. Its rows are keyed by hidden columns (a row's text and
 * position), so it is compared by its columns, as multisets.
 */
export interface Copies {
  target: string;
  columns: string[];
  statement: string;
}

/**
 * Waits for `c` to converge, then compares its rows with the statement run by Postgres, as
 * multisets of each column's text: `value` writes that text (`"col"::text` unless given;
 * `trim_scale(...)` where which of equal values a row shows is Postgres's pick). Returns
 * how many rows the statement has (a comparison of empty sets proves little).
 */
export async function expectCopies(
  live: LivePipeline,
  c: Copies,
  value: (column: string) => string = (column) => `${column}::text`,
): Promise<number> {
  const token = await live.trellis.watermarkToken();
  await live.trellis.awaitConverged(c.target, token, { timeoutMs: 25_000 });
  const cols = c.columns.map((n) => `${value(`"${n}"`)} AS "${n}"`).join(', ');
  const rows = async (from: string) =>
    (await live.db.sql.unsafe<Record<string, string | null>[]>(`SELECT ${cols} FROM ${from}`))
      .map((r) => JSON.stringify(c.columns.map((n) => r[n] ?? null)))
      .sort();
  const expected = await rows(`(${c.statement}) AS s`);
  expect({ target: c.target, rows: await rows(c.target) }).toEqual({
    target: c.target,
    rows: expected,
  });
  return expected.length;
}
