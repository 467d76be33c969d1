import { describe, expect, it } from 'vitest';
import { installSql } from '../src/migration/index.js';
import { TEST_CAPTURE, waitUntilOnTheSlot } from './support/capture-mode.js';
import { freshDatabase } from './support/database.js';
import { livePipeline } from './support/live.js';
import { rejection, waitFor, waitForStatus } from './support/trellis.js';

// <schema>.status(target) and <schema>.definitions() from SQL, as someone in psql or in a
// migration reads them: the handle's shapes, as JSON.

const live = livePipeline({ quarantineThreshold: 3 });

/** What `JSON.stringify` makes of a handle's value, with times as instants to compare. */
function asJson(value: unknown): unknown {
  return JSON.parse(JSON.stringify(value), (key, v: unknown) => {
    // What moves between two reads: the slot's position and retained WAL (WAL capture),
    // the lag (a tick can be sealed, or applied, between them), the drain time spent (a page
    // can end between them), and the workers' health,
    // which moves with every pass (a read before the staging worker's first recorded pass
    // sees none; test/worker-health.test.ts checks those fields).
    if (
      key === 'confirmedLsn' ||
      key === 'retainedBytes' ||
      key === 'lag' ||
      key === 'drain' ||
      key === 'workers'
    ) {
      return typeof v;
    }
    return typeof v === 'string' && /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d/.test(v)
      ? new Date(v).getTime()
      : v;
  });
}

describe('SQL-side reads', () => {
  it('status(target) reports what happened, as the handle does', async () => {
    const { db, trellis } = live;
    await db.sql.unsafe(`
      CREATE TABLE sr_items (id int PRIMARY KEY, a numeric NOT NULL, b numeric NOT NULL, g int NOT NULL);
      INSERT INTO sr_items SELECT i, i, 1, i % 3 FROM generate_series(1, 30) i;`);
    await trellis.apply('TRANSFORM sr_ratios FROM sr_items SELECT a / b AS ratio, a AS plain');
    await trellis.apply('TRANSFORM sr_groups FROM sr_items SELECT g, sum(a) AS total GROUP BY g');
    await waitForStatus(trellis, 'sr_ratios', 'live');
    await waitForStatus(trellis, 'sr_groups', 'live');
    // Under WAL capture, the source's move from triggers to the slot is over before the
    // two reads compared below (its mode would change between them).
    if (TEST_CAPTURE === 'logical') await waitUntilOnTheSlot(db.sql);

    // Four rows whose ratio fails: held at sr_ratios.ratio, which pauses at the threshold.
    await db.sql.unsafe('UPDATE sr_items SET b = 0 WHERE id <= 4');
    await waitFor(
      async () => (await trellis.status('sr_ratios')).pausedColumns.length > 0,
      'the ratio column to pause',
    );
    const [{ status }] = (await db.sql.unsafe(
      `SELECT trellis.status('sr_ratios') AS status`,
    )) as unknown as [{ status: Record<string, unknown> }];
    expect(status).toMatchObject({
      target: 'sr_ratios',
      // The column pauses at its third held key, and the fourth is left for after RESUME
      // (held keys count as they are found, ADR 0040).
      heldKeys: 3,
      pausedColumns: ['sr_ratios.ratio'],
      captureFailure: null,
      captureWait: null,
      lag: { segments: expect.any(Number), seconds: expect.any(Number) },
    });
    expect(asJson(status)).toEqual(asJson(await trellis.status('sr_ratios')));

    // A group-by target with no index on its group column: a gap, and its fix.
    const [{ groups }] = (await db.sql.unsafe(
      `SELECT trellis.status('sr_groups') AS groups`,
    )) as unknown as [{ groups: Record<string, unknown> }];
    expect(groups).toMatchObject({
      status: 'live',
      pauseReason: null,
      heldKeys: 0,
      sourceIndexGaps: [
        {
          table: 'public.sr_items',
          columns: ['g'],
          role: 'group_by',
          optedOut: false,
          fix: 'CREATE INDEX CONCURRENTLY ON public.sr_items (g)',
          fixInMigration: 'CREATE INDEX ON public.sr_items (g)',
        },
      ],
    });
    expect(asJson(groups)).toEqual(asJson(await trellis.status('sr_groups')));

    // An operator's pause, read from SQL.
    await trellis.apply('PAUSE TRANSFORM sr_groups');
    const [{ paused }] = (await db.sql.unsafe(
      `SELECT trellis.status('sr_groups')->>'status' AS paused`,
    )) as unknown as [{ paused: string }];
    expect(paused).toBe('paused');

    const missing = await rejection(db.sql.unsafe(`SELECT trellis.status('no_such')`));
    expect(missing).toMatchObject({
      code: 'TRN01',
      message: 'there is no transform named no_such',
    });
  });

  it('definitions() lists every transform as the handle does, by target', async () => {
    const { db, trellis } = live;
    await db.sql.unsafe(`
      CREATE TABLE sr_owners (id int PRIMARY KEY, name text NOT NULL);
      CREATE TABLE sr_pets (id int PRIMARY KEY, owner_id int, kind text);`);
    await trellis.apply(
      'TRANSFORM sr_pet_owners FROM sr_pets p LEFT JOIN sr_owners o ON o.id = p.owner_id SELECT p.kind, o.name WITHOUT SOURCE INDEX',
    );
    const rows = (await db.sql.unsafe(
      `SELECT d FROM trellis.definitions() d`,
    )) as unknown as Array<{ d: Record<string, unknown> }>;
    const fromSql = rows.map((r) => r.d);
    expect(fromSql.map((d) => d.target)).toEqual(
      [...fromSql.map((d) => d.target as string)].sort(),
    );
    const petOwners = fromSql.find((d) => d.target === 'sr_pet_owners');
    expect(petOwners).toMatchObject({
      targetSchema: 'public',
      statement:
        'TRANSFORM sr_pet_owners FROM public.sr_pets AS p LEFT JOIN public.sr_owners AS o ON o.id = p.owner_id SELECT p.kind AS kind, o.name AS name WITHOUT SOURCE INDEX',
      sources: [
        { table: 'public.sr_pets', alias: 'p', join: null, keyColumns: ['id'] },
        { table: 'public.sr_owners', alias: 'o', join: 'left', keyColumns: ['id'] },
      ],
      columns: expect.arrayContaining([
        { name: 'kind', type: 'text', expression: 'p.kind', key: false, implicit: false },
      ]),
      options: { withoutSourceIndex: true },
      aggregates: false,
    });
    expect(asJson(fromSql)).toEqual(asJson(await trellis.definitions()));
  });

  it('works inside a migration transaction, after the statement that defines the transform', async () => {
    const db = await freshDatabase();
    const seen = await db.sql.begin(async (tx) => {
      await tx.unsafe(installSql());
      await tx.unsafe('CREATE TABLE m_items (id int PRIMARY KEY, v int)');
      await tx.unsafe(`SELECT trellis.apply('TRANSFORM m_copy FROM m_items SELECT v')`);
      return tx.unsafe(
        `SELECT trellis.status('m_copy')->>'status' AS status,
                (SELECT count(*)::int FROM trellis.definitions()) AS definitions`,
      );
    });
    expect([...seen]).toEqual([{ status: 'waiting_to_backfill', definitions: 1 }]);
  });
});
