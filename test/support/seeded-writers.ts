import type postgres from 'postgres';

/** A statement for writer `w`'s `i`-th write, drawn with `r` (uniform in [0, 1)). */
export type SeededStatement = (r: () => number, w: number, i: number) => string;

/**
 * Writers 1…`writers` at once, each running `rounds` transactions of one to three
 * statements from `statement`, a quarter of them rolled back; each writer's draws come from
 * `seed` and its number, so a run replays. A deadlock counts as a rollback.
 */
export async function seededWriters(
  sql: postgres.Sql,
  seed: number,
  statement: SeededStatement,
  { writers = 3, rounds = 40 }: { writers?: number; rounds?: number } = {},
): Promise<void> {
  const writer = async (w: number) => {
    let state = seed * 7919 + w;
    const r = () => {
      state = (state * 1103515245 + 12345) % 2147483648;
      return state / 2147483648;
    };
    for (let i = 0; i < rounds; i += 1) {
      const batch = Array.from({ length: 1 + Math.floor(r() * 3) }, (_, k) =>
        statement(r, w, i * 4 + k),
      );
      const rollback = r() < 0.25;
      try {
        await sql.begin(async (tx) => {
          for (const one of batch) await tx.unsafe(one);
          if (rollback) throw new Error('rollback');
        });
      } catch (e) {
        const code = (e as { code?: string }).code;
        if (!(rollback && (e as Error).message === 'rollback') && code !== '40P01') throw e;
      }
    }
  };
  await Promise.all(Array.from({ length: writers }, (_, i) => writer(i + 1)));
}
