import { beforeAll, describe, expect, it } from 'vitest';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { rejection, waitFor, waitForStatus } from './support/trellis.js';

// The quarantine (issue #9): a key whose re-derivation fails is held at the narrowest
// address that explains it, every other key and column flows, an operator finds the rows,
// fixes them, and releases or resumes; then the target equals its definition again.

const live = livePipeline({ quarantineThreshold: 6 });

async function settle(...targets: string[]): Promise<void> {
  const token = await live.trellis.watermarkToken();
  for (const t of targets) await live.trellis.awaitConverged(t, token, { timeoutMs: 20_000 });
}

async function rowOf(target: string, id: number): Promise<Record<string, unknown> | undefined> {
  const [row] = await live.db.sql.unsafe(`SELECT * FROM ${target} WHERE id = $1`, [id]);
  return row;
}

describe('quarantine per address', () => {
  const ratios: Definition = {
    target: 'q_ratios',
    from: 'q_items',
    select: 'a / b AS ratio, c::int AS num, a AS plain',
    implicit: 'id',
  };
  const filtered: Definition = {
    target: 'q_filtered',
    from: 'q_items',
    select: 'a AS plain',
    where: 'a / b > 1',
    implicit: 'id',
  };
  const plain: Definition = { target: 'q_plain', from: 'q_items', select: 'a, b', implicit: 'id' };

  beforeAll(async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE q_items (id int PRIMARY KEY, a numeric NOT NULL, b numeric NOT NULL, c text NOT NULL);
      INSERT INTO q_items SELECT i, i * 10, 2, i::text FROM generate_series(1, 20) i;`);
    for (const d of [ratios, filtered, plain]) {
      await live.trellis.apply(transformStatement(d));
      await waitForStatus(live.trellis, d.target, 'live');
    }
  });

  it('holds a row at the column whose expression fails; the row and every other transform flow', async () => {
    await live.db.sql.unsafe(`
      INSERT INTO q_items VALUES (101, 5, 0, '7'), (102, 6, 3, 'x'), (103, 7, 0, 'y');
      UPDATE q_items SET b = 0, a = 500 WHERE id = 5;`);
    await settle(ratios.target, filtered.target, plain.target);
    // 101: only the ratio fails. Written with num and plain; ratio NULL (a new row).
    expect(await rowOf('q_ratios', 101)).toEqual({ ratio: null, num: 7, plain: '5', id: 101 });
    // 102: only num fails.
    expect(await rowOf('q_ratios', 102)).toEqual({
      ratio: '2.0000000000000000',
      num: null,
      plain: '6',
      id: 102,
    });
    // 103: both: held at both addresses, the key column and plain written.
    expect(await rowOf('q_ratios', 103)).toEqual({ ratio: null, num: null, plain: '7', id: 103 });
    // 5 was good and went bad: ratio keeps its last value, plain moves on.
    expect(await rowOf('q_ratios', 5)).toEqual({
      ratio: '25.0000000000000000',
      num: 5,
      plain: '500',
      id: 5,
    });
    // The WHERE fails for the same rows: no column explains that, the key is held whole.
    expect((await live.trellis.quarantineStatus('q_filtered')).count).toBe(3);
    // A transform reading the same rows that does not fail is not held up.
    await expectMatchesDefinition(live.db.sql, plain);

    const entries = await live.trellis.quarantined();
    expect(entries.map((e) => [e.address, e.count, e.paused])).toEqual([
      ['q_filtered', 3, false],
      ['q_ratios.num', 2, false],
      ['q_ratios.ratio', 3, false],
    ]);
    for (const e of entries) expect(e.oldestPoisonedAt).toBeInstanceOf(Date);
    const ratioKeys = await live.trellis.sampleQuarantined('q_ratios.ratio', { limit: 10 });
    expect(ratioKeys.nextCursor).toBeNull();
    expect(ratioKeys.samples.map((x) => [x.srcTable, x.key, x.sqlstate])).toEqual([
      ['public.q_items', '101', '22012'],
      ['public.q_items', '103', '22012'],
      ['public.q_items', '5', '22012'],
    ]);
    expect(ratioKeys.samples[0]!.error).toContain('division by zero');
    const since = await live.trellis.poisonedSince(new Date(Date.now() - 60_000));
    expect(
      since
        .filter((p) => p.transform === 'q_ratios.num')
        .map((p) => p.key)
        .sort(),
    ).toEqual(['102', '103']);
    expect(await live.trellis.poisonedSince(new Date(Date.now() + 60_000))).toEqual([]);
    expect((await live.trellis.status('q_ratios')).heldKeys).toBe(5);
  });

  it('refuses unknown addresses with not_found, and a bad cursor with validation', async () => {
    expect((await rejection(live.trellis.quarantineStatus('nope'))).code).toBe('not_found');
    expect((await rejection(live.trellis.quarantineStatus('q_ratios.nope'))).code).toBe(
      'not_found',
    );
    expect(
      (await rejection(live.trellis.sampleQuarantined('q_ratios', { cursor: 'garbage' }))).code,
    ).toBe('validation');
    expect(
      (await rejection(live.trellis.releaseKey('q_ratios.ratio', 'public.q_items', '999'))).code,
    ).toBe('not_found');
  });

  it('releases a fixed key, and reports one still failing as held again', async () => {
    await live.db.sql`UPDATE q_items SET b = 4 WHERE id = 101`;
    // Still bad: 103's ratio (b = 0).
    expect(await live.trellis.releaseKey('q_ratios.ratio', 'public.q_items', '103')).toMatchObject({
      released: false,
      address: 'q_ratios.ratio',
      sqlstate: '22012',
    });
    expect(await live.trellis.releaseKey('q_ratios.ratio', 'public.q_items', '101')).toEqual({
      released: true,
    });
    expect(await rowOf('q_ratios', 101)).toMatchObject({ ratio: '1.2500000000000000', num: 7 });
  });

  it('pages through an address in key order while keys are added and released', async () => {
    // More bad rows for num: at the threshold (6) the column pauses itself.
    await live.db.sql.unsafe(
      `INSERT INTO q_items SELECT i, i, 1, 'bad' || i FROM generate_series(201, 203) i`,
    );
    await settle(ratios.target);
    expect((await live.trellis.quarantineStatus('q_ratios.num')).count).toBe(5);
    const seen: string[] = [];
    let page = await live.trellis.sampleQuarantined('q_ratios.num', { limit: 2 });
    seen.push(...page.samples.map((x) => x.key));
    // Meanwhile: one key released (after the cursor), one added (before it).
    await live.db.sql`UPDATE q_items SET c = '9' WHERE id = 203`;
    expect((await live.trellis.releaseKey('q_ratios.num', 'public.q_items', '203')).released).toBe(
      true,
    );
    while (page.nextCursor) {
      page = await live.trellis.sampleQuarantined('q_ratios.num', {
        limit: 2,
        cursor: page.nextCursor,
      });
      seen.push(...page.samples.map((x) => x.key));
    }
    // In order, none twice, the released one gone.
    expect(seen).toEqual(['102', '103', '201', '202']);
  });

  it('pauses a column at the threshold; the rest flows; RESUME of the column rebuilds it', async () => {
    await live.db.sql.unsafe(
      `INSERT INTO q_items SELECT i, i, 1, 'bad' || i FROM generate_series(301, 303) i`,
    );
    await waitFor(
      async () => (await live.trellis.status('q_ratios')).pausedColumns.includes('q_ratios.num'),
      'the column to pause',
    );
    const entry = (await live.trellis.quarantined()).find((e) => e.address === 'q_ratios.num');
    expect(entry?.paused).toBe(true);
    // The transform still flows without the column.
    await live.db.sql`UPDATE q_items SET a = 1000 WHERE id = 1`;
    await settle(ratios.target);
    expect(await rowOf('q_ratios', 1)).toMatchObject({
      plain: '1000',
      ratio: '500.0000000000000000',
    });

    // Fix every row, RESUME the column and the transform: each target equals its definition.
    await live.db.sql`UPDATE q_items SET c = id::text, b = greatest(b, 1)`;
    expect(await live.trellis.apply('RESUME TRANSFORM q_ratios.num')).toEqual({
      kind: 'resumed',
      addresses: ['q_ratios.num'],
    });
    expect((await live.trellis.quarantineStatus('q_ratios.num')).count).toBe(0);
    await live.trellis.apply('RESUME TRANSFORM q_ratios');
    await live.trellis.apply('RESUME TRANSFORM q_filtered');
    await waitForStatus(live.trellis, 'q_ratios', 'live');
    await settle(ratios.target, filtered.target, plain.target);
    for (const d of [ratios, filtered, plain]) await expectMatchesDefinition(live.db.sql, d);
    expect(await live.trellis.quarantined()).toEqual([]);
  });
});
