import { describe, expect, it } from 'vitest';
import { sqlClient } from './support/database.js';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';
import { waitFor } from './support/trellis.js';

// A rebuild (after a source TRUNCATE, ALTER … ADD COLUMN, a settings change, RESUME of a
// paused column) used to empty the target with TRUNCATE, which is not MVCC-safe: a
// REPEATABLE READ (or SERIALIZABLE) reader whose snapshot came before it read the target
// EMPTY afterwards — a silently wrong read — and a reader that had read the target held
// the rebuild off (ACCESS EXCLUSIVE), every later reader queueing behind it. Here a
// repeatable-read reader opens its snapshot, the rebuild runs and completes (the target
// then equals its definition run by Postgres), and the reader reads the target again in
// the same transaction: it must see exactly the rows it saw before, with no error
// (ADR 0076).

const live = livePipeline({
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE rr_other (id int PRIMARY KEY);
      INSERT INTO rr_other VALUES (1);
      CREATE TABLE rr_kinds (id int PRIMARY KEY, name text NOT NULL);
      INSERT INTO rr_kinds SELECT i, 'kind ' || i FROM generate_series(0, 9) i;`);
    for (const t of ['rr_a', 'rr_b', 'rr_c', 'rr_d', 'rr_e', 'rr_f']) {
      await db.sql.unsafe(`
        CREATE TABLE ${t} (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL, ts timestamptz NOT NULL);
        CREATE INDEX ON ${t} (g);
        INSERT INTO ${t}
          SELECT i, i % 10, i % 37, timestamptz '2024-01-01 12:00+00' + i * interval '1 hour'
            FROM generate_series(1, 3000) i;
        ANALYZE ${t};`);
    }
  },
});

type Row = Record<string, unknown>;

/**
 * A repeatable-read reader of `target` (its `columns`, ordered by `order`) across
 * `rebuild`: its snapshot is opened by reading the target itself ('target') or another
 * table ('other': the reader has taken no lock on the target, so nothing waits for it).
 * Returns what it read before (for 'other', read by another session just before the
 * snapshot, nothing writing meanwhile) and after, in the same transaction.
 */
async function readAcross(
  target: string,
  columns: string,
  order: string,
  opensOn: 'target' | 'other',
  rebuild: () => Promise<void>,
): Promise<{ before: Row[]; after: Row[] }> {
  const read = `SELECT ${columns} FROM ${target} ORDER BY ${order}`;
  const reader = sqlClient(live.db.url, { max: 1 });
  try {
    let before: Row[] = opensOn === 'other' ? [...(await live.db.sql.unsafe(read))] : [];
    let after: Row[] = [];
    await reader.begin('isolation level repeatable read', async (tx) => {
      if (opensOn === 'target') before = [...(await tx.unsafe(read))];
      else await tx.unsafe('SELECT id FROM rr_other');
      await rebuild();
      after = [...(await tx.unsafe(read))];
    });
    return { before, after };
  } finally {
    await reader.end({ timeout: 2 });
  }
}

/** The rebuild has completed: the target converged on `d` (compared with Postgres's answer). */
async function rebuilt(d: Definition): Promise<void> {
  await live.converged(d);
}

describe('a rebuild under a repeatable-read reader', () => {
  it('after a source TRUNCATE (a projection; the reader opened its snapshot elsewhere)', {
    timeout: 120_000,
  }, async () => {
    const d: Definition = { target: 'rr_a_t', from: 'rr_a', select: 'g, v', implicit: 'id' };
    await live.define(d);
    await live.converged(d);
    const { before, after } = await readAcross(d.target, 'id, g, v', 'id', 'other', async () => {
      await live.db.sql`TRUNCATE rr_a`;
      await live.db.sql`INSERT INTO rr_a VALUES (1, 1, 1, now())`;
      await rebuilt(d);
      expect(await live.db.sql`SELECT count(*)::int AS n FROM rr_a_t`).toEqual([{ n: 1 }]);
    });
    expect(before).toHaveLength(3000);
    expect(after).toEqual(before);
  });

  it('after a source TRUNCATE (a GROUP BY kept by delta; the reader read the target first)', {
    timeout: 120_000,
  }, async () => {
    const d: Definition = {
      target: 'rr_b_t',
      from: 'rr_b',
      select: 'g, count(*) AS n, sum(v) AS total',
      groupBy: 'g',
    };
    await live.define(d);
    await live.converged(d);
    const { before, after } = await readAcross(d.target, 'g, n, total', 'g', 'target', async () => {
      await live.db.sql`TRUNCATE rr_b`;
      await live.db.sql`INSERT INTO rr_b SELECT i, i % 3, i, now() FROM generate_series(1, 30) i`;
      await rebuilt(d);
      expect(await live.db.sql`SELECT count(*)::int AS n FROM rr_b_t`).toEqual([{ n: 3 }]);
    });
    expect(before).toHaveLength(10);
    expect(after).toEqual(before);
  });

  it('after ALTER … ADD COLUMN (a join with a key map; the reader opened its snapshot elsewhere)', {
    timeout: 120_000,
  }, async () => {
    const d: Definition = {
      target: 'rr_c_t',
      from: 'rr_c i JOIN rr_kinds k ON k.id = i.g',
      select: 'k.name, i.v',
      implicit: 'i.id AS id, k.id AS k_id',
    };
    await live.define(d);
    await live.converged(d);
    const added: Definition = { ...d, select: 'k.name, i.v, i.v * 2 AS twice' };
    const { before, after } = await readAcross(d.target, 'id, name, v', 'id', 'other', async () => {
      await live.trellis.apply('ALTER TRANSFORM rr_c_t ADD COLUMN i.v * 2 AS twice');
      await rebuilt(added);
    });
    expect(before).toHaveLength(3000);
    expect(after).toEqual(before);
  });

  it('after ALTER … SET (timezone) (a projection; the reader read the target first)', {
    timeout: 120_000,
  }, async () => {
    const [{ zone }] = (await live.db
      .sql`SELECT current_setting('TimeZone') AS zone`) as unknown as [{ zone: string }];
    // The statement reads ts::date: its value follows the TimeZone recorded with it.
    const d: Definition = {
      target: 'rr_d_t',
      from: 'rr_d',
      select: 'g, ts::date AS day',
      implicit: 'id',
    };
    const at = (z: string): Definition => ({
      ...d,
      select: `g, (ts AT TIME ZONE '${z}')::date AS day`,
    });
    await live.define(d);
    await live.converged(at(zone));
    const other = zone === 'Asia/Tokyo' ? 'America/New_York' : 'Asia/Tokyo';
    const { before, after } = await readAcross(d.target, 'id, g, day', 'id', 'target', async () => {
      await live.trellis.apply(`ALTER TRANSFORM rr_d_t SET (timezone = '${other}')`);
      await rebuilt(at(other));
    });
    expect(before).toHaveLength(3000);
    expect(after).toEqual(before);
  });

  it('after RESUME of a paused column (a GROUP BY; the reader read the target first)', {
    timeout: 120_000,
  }, async () => {
    const d: Definition = {
      target: 'rr_e_t',
      from: 'rr_e',
      select: 'g, count(*) AS n, sum(v) AS total',
      groupBy: 'g',
    };
    await live.define(d);
    await live.converged(d);
    await live.trellis.apply('PAUSE TRANSFORM rr_e_t.total');
    await live.db.sql`UPDATE rr_e SET v = v + 1000 WHERE id % 2 = 0`;
    const token = await live.trellis.watermarkToken();
    await live.trellis.awaitConverged(d.target, token, { timeoutMs: 25_000 });
    const { before, after } = await readAcross(d.target, 'g, n, total', 'g', 'target', async () => {
      await live.trellis.apply('RESUME TRANSFORM rr_e_t.total');
      await rebuilt(d);
    });
    expect(before).toHaveLength(10);
    // The paused column was stale before the rebuild, and is right after it.
    expect(after).toEqual(before);
    expect(await live.db.sql`SELECT g, n, total FROM rr_e_t ORDER BY g`).not.toEqual(before);
  });

  it('after RESUME of a target whose key was dropped (the reader opened its snapshot elsewhere: adding the key back takes ACCESS EXCLUSIVE, as any DDL)', {
    timeout: 120_000,
  }, async () => {
    const d: Definition = { target: 'rr_f_t', from: 'rr_f', select: 'g, v', implicit: 'id' };
    await live.define(d);
    await live.converged(d);
    await live.db.sql.unsafe('ALTER TABLE rr_f_t DROP CONSTRAINT rr_f_t_pkey');
    await waitFor(
      async () => (await live.trellis.status(d.target)).captureFailure?.kind === 'halt',
      'rr_f_t to halt',
    );
    const { before, after } = await readAcross(d.target, 'id, g, v', 'id', 'other', async () => {
      await live.trellis.apply('RESUME TRANSFORM rr_f_t');
      await live.db.sql`UPDATE rr_f SET v = v + 1 WHERE id <= 5`;
      await rebuilt(d);
    });
    expect(before).toHaveLength(3000);
    expect(after).toEqual(before);
  });
});
