import { describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { rejection, waitFor, waitForStatus } from './support/trellis.js';

// Halts (issue #9): a target changed outside Trellis so the drain cannot keep it. The
// transform stops with a sentence saying so; RESUME repairs what it can and rebuilds, or
// refuses with `conflict` saying what to do.

let n = 0;
const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE h_src (id int PRIMARY KEY, name text NOT NULL, price numeric NOT NULL);
      INSERT INTO h_src SELECT i, 'n' || i, i FROM generate_series(1, 100) i;`);
  },
});

async function target(): Promise<Definition> {
  n += 1;
  const d: Definition = { target: `h_t${n}`, from: 'h_src', select: 'name, price', implicit: 'id' };
  await live.trellis.apply(transformStatement(d));
  await waitForStatus(live.trellis, d.target, 'live');
  return d;
}

async function haltOf(d: Definition): Promise<string> {
  await waitFor(
    async () => (await live.trellis.status(d.target)).captureFailure?.kind === 'halt',
    `${d.target} to halt`,
  );
  const status = await live.trellis.status(d.target);
  expect([status.status, status.pauseReason]).toEqual(['paused', 'capture_failure']);
  return status.captureFailure!.error;
}

async function resumed(d: Definition): Promise<void> {
  await live.trellis.apply(`RESUME TRANSFORM ${d.target}`);
  await waitForStatus(live.trellis, d.target, 'live');
  await live.db.sql`UPDATE h_src SET price = price + 1 WHERE id <= 3`;
  await live.trellis.awaitConverged(d.target, await live.trellis.watermarkToken());
  await expectMatchesDefinition(live.db.sql, d);
  expect((await live.trellis.status(d.target)).captureFailure).toBeNull();
}

describe('halts', () => {
  it('a target dropped: RESUME makes it again', async () => {
    const d = await target();
    await live.db.sql.unsafe(`DROP TABLE ${d.target}`);
    expect(await haltOf(d)).toBe(`the target public.${d.target} was dropped`);
    await resumed(d);
  });

  it('a target column dropped: RESUME adds it back', async () => {
    const d = await target();
    await live.db.sql.unsafe(`ALTER TABLE ${d.target} DROP COLUMN price`);
    expect(await haltOf(d)).toBe(
      `column price of the target public.${d.target} was dropped or renamed`,
    );
    expect((await live.trellis.status(d.target)).captureFailure?.columns).toEqual(['price']);
    await resumed(d);
  });

  it('a target column renamed or retyped: RESUME refuses until it is put back', async () => {
    const renamed = await target();
    const retyped = await target();
    await live.db.sql.unsafe(`ALTER TABLE ${renamed.target} RENAME COLUMN name TO label`);
    await live.db.sql.unsafe(`ALTER TABLE ${retyped.target} ALTER COLUMN price TYPE text`);
    await haltOf(renamed);
    expect(await haltOf(retyped)).toBe(
      `column price of the target public.${retyped.target} changed type from numeric to text`,
    );
    const refusedRename = await rejection(live.trellis.apply(`RESUME TRANSFORM ${renamed.target}`));
    expect(refusedRename.code).toBe('conflict');
    expect(refusedRename.message).toContain('rename it back to name');
    const refusedType = await rejection(live.trellis.apply(`RESUME TRANSFORM ${retyped.target}`));
    expect(refusedType.code).toBe('conflict');
    expect(refusedType.message).toContain('alter it back');
    await live.db.sql.unsafe(`ALTER TABLE ${renamed.target} RENAME COLUMN label TO name`);
    await live.db.sql.unsafe(
      `ALTER TABLE ${retyped.target} ALTER COLUMN price TYPE numeric USING price::numeric`,
    );
    await resumed(renamed);
    await resumed(retyped);
  });

  it('the guard trigger dropped (and the app wrote the target), or the key dropped: RESUME restores them', async () => {
    const unguarded = await target();
    const keyless = await target();
    await live.db.sql.unsafe(`DROP TRIGGER trellis_guard ON ${unguarded.target}`);
    await live.db.sql.unsafe(`INSERT INTO ${unguarded.target} VALUES ('stray', 0, 9999)`);
    expect(await haltOf(unguarded)).toMatch(/guard trigger on the target/);
    await live.db.sql.unsafe(
      `ALTER TABLE ${keyless.target} DROP CONSTRAINT ${keyless.target}_pkey`,
    );
    expect(await haltOf(keyless)).toBe(
      `the key of the target public.${keyless.target} was dropped`,
    );
    await resumed(unguarded);
    await resumed(keyless);
    // The guard is back: the app cannot write the target.
    expect((await rejection(live.db.sql.unsafe(`DELETE FROM ${unguarded.target}`))).code).toBe(
      'TRW01',
    );
  });
});
