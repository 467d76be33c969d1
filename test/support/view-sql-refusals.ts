import { expect } from 'vitest';
import { TrellisError } from '../../src/engine/index.js';
import type { LivePipeline } from './live.js';

/**
 * Defines `TRANSFORM refused AS <select>` and checks what a user would: it is refused with
 * a `validation` TrellisError whose message contains `named`, and nothing of it stays behind
 * (no target, and no hidden part `trellis#refused#…`).
 */
export async function expectRefusedAs(
  live: LivePipeline,
  select: string,
  named: string,
): Promise<void> {
  const error = await live.trellis.apply(`TRANSFORM refused AS ${select}`).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(TrellisError);
  expect({
    code: (error as TrellisError).code,
    message: (error as TrellisError).message,
  }).toMatchObject({ code: 'validation', message: expect.stringContaining(named) });
  const [left] = await live.db.sql<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_class
     WHERE relname LIKE 'trellis#refused#%' OR relname = 'refused'`;
  expect(left?.n).toBe(0);
}
