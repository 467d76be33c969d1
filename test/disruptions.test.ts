import { describe, expect, it } from 'vitest';
import { ResumeRefused, resumeCaptureDisruptions } from '../src/testing/index.js';
import { livePipeline } from './support/live.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { rejection, waitFor, waitForStatus } from './support/trellis.js';

// Capture changed outside Trellis (issue #9): the rows written meanwhile never reached the
// ledger, so every transform reading the table stops with kind 'disruption' rather than
// show wrong data, until a RESUME rebuilds it.

// Disruptions of trigger capture (ADR 0010): run with triggers whatever the suite's
// capture is (WAL capture's are in test/wal-disruptions.test.ts).
const live = livePipeline({ capture: 'trigger' });

async function source(table: string): Promise<Definition> {
  await live.db.sql.unsafe(`
    CREATE TABLE ${table} (id int PRIMARY KEY, v int NOT NULL);
    INSERT INTO ${table} SELECT i, i FROM generate_series(1, 50) i;`);
  const d: Definition = { target: `${table}_t`, from: table, select: 'v', implicit: 'id' };
  await live.trellis.apply(transformStatement(d));
  await waitForStatus(live.trellis, d.target, 'live');
  return d;
}

async function disruptionOf(target: string) {
  await waitFor(
    async () => (await live.trellis.status(target)).captureFailure?.kind === 'disruption',
    `${target} to stop on a disruption`,
  );
  const status = await live.trellis.status(target);
  expect(status.status).toBe('paused');
  return status;
}

describe('capture disruptions', () => {
  it('a fixture load with triggers disabled stops the readers; resumeCaptureDisruptions rebuilds them', async () => {
    const d = await source('fx_load');
    await live.db.sql.begin(async (tx) => {
      await tx`ALTER TABLE fx_load DISABLE TRIGGER ALL`;
      await tx`INSERT INTO fx_load SELECT i, i * 10 FROM generate_series(51, 80) i`;
      await tx`UPDATE fx_load SET v = -v WHERE id <= 5`;
      await tx`ALTER TABLE fx_load ENABLE TRIGGER ALL`;
    });
    const status = await disruptionOf(d.target);
    expect(status.pauseReason).toBe('disruption');
    expect(status.captureFailure?.error).toMatch(
      /^capture trigger trellis_capture_\w+ on public.fx_load was/,
    );
    // Nothing pretends the target has caught up: a wait on it fails at once (ADR 0038).
    const token = await live.trellis.watermarkToken();
    expect(
      (await rejection(live.trellis.awaitConverged(d.target, token, { timeoutMs: 300 }))).code,
    ).toBe('conflict');
    expect(await resumeCaptureDisruptions(live.trellis)).toEqual([d.target]);
    expect((await live.trellis.status(d.target)).status).toBe('live');
    await expectMatchesDefinition(live.db.sql, d);
    // Capture is back, ALWAYS: later writes flow.
    await live.db.sql`UPDATE fx_load SET v = 0 WHERE id = 60`;
    await live.trellis.awaitConverged(d.target, await live.trellis.watermarkToken());
    await expectMatchesDefinition(live.db.sql, d);
    expect(await resumeCaptureDisruptions(live.trellis)).toEqual([]);
  });

  it('detectCaptureDisruptions() finds them at once: a trigger dropped, a function replaced', async () => {
    const dropped = await source('fx_dropped');
    const replaced = await source('fx_replaced');
    await live.db.sql`DROP TRIGGER trellis_capture_update ON fx_dropped`;
    const [fn] = await live.db.sql<{ fn: string }[]>`
      SELECT p.oid::regprocedure::text AS fn FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
       WHERE t.tgrelid = 'fx_replaced'::regclass AND t.tgname = 'trellis_capture_insert'`;
    await live.db.sql.unsafe(
      `CREATE OR REPLACE FUNCTION ${fn!.fn} RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`,
    );
    // The staging worker's pass (every 200 ms) may get to one first; together they find both.
    const found = await live.trellis.detectCaptureDisruptions();
    expect(found.filter((t) => !['public.fx_dropped', 'public.fx_replaced'].includes(t))).toEqual(
      [],
    );
    await disruptionOf(dropped.target);
    await disruptionOf(replaced.target);
    expect((await live.trellis.status(dropped.target)).captureFailure).toMatchObject({
      kind: 'disruption',
      error: 'capture trigger trellis_capture_update on public.fx_dropped was dropped',
      columns: [],
    });
    expect((await live.trellis.status(replaced.target)).captureFailure?.error).toBe(
      'capture functions of public.fx_replaced were replaced or dropped outside Trellis',
    );
    await live.db.sql`INSERT INTO fx_replaced VALUES (99, 99)`;
    expect((await resumeCaptureDisruptions(live.trellis)).sort()).toEqual([
      dropped.target,
      replaced.target,
    ]);
    await expectMatchesDefinition(live.db.sql, dropped);
    await expectMatchesDefinition(live.db.sql, replaced);
  });

  it('leaves operator pauses paused, and reports refused RESUMEs after resuming the rest', async () => {
    const kept = await source('fx_kept');
    const gone = await source('fx_gone');
    const fine = await source('fx_fine');
    await live.trellis.apply(`PAUSE TRANSFORM ${kept.target}`);
    for (const t of ['fx_kept', 'fx_gone', 'fx_fine']) {
      await live.db.sql.unsafe(`ALTER TABLE ${t} DISABLE TRIGGER USER`);
      await live.db.sql.unsafe(`INSERT INTO ${t} VALUES (1000, 1)`);
      await live.db.sql.unsafe(`ALTER TABLE ${t} ENABLE TRIGGER USER`);
    }
    const found = await live.trellis.detectCaptureDisruptions();
    expect(
      found.filter((t) => !['public.fx_fine', 'public.fx_gone', 'public.fx_kept'].includes(t)),
    ).toEqual([]);
    for (const d of [kept, gone, fine]) {
      await waitFor(
        async () => (await live.trellis.status(d.target)).captureFailure?.kind === 'disruption',
        `${d.target} to stop on a disruption`,
      );
    }
    // Its table dropped before the resume: that RESUME is refused.
    await live.db.sql`DROP TABLE fx_gone`;
    const refused = await rejection(resumeCaptureDisruptions(live.trellis));
    expect(refused).toBeInstanceOf(ResumeRefused);
    expect(Object.keys((refused as unknown as ResumeRefused).refused)).toEqual([gone.target]);
    expect((refused as unknown as ResumeRefused).resumed).toEqual([fine.target]);
    await expectMatchesDefinition(live.db.sql, fine);
    // The operator's pause stands; its own RESUME rebuilds it (it missed the load too).
    const status = await live.trellis.status(kept.target);
    expect([status.status, status.pauseReason, status.captureFailure?.kind]).toEqual([
      'paused',
      'operator',
      'disruption',
    ]);
    await live.trellis.apply(`RESUME TRANSFORM ${kept.target}`);
    await waitForStatus(live.trellis, kept.target, 'live');
    await live.trellis.awaitConverged(kept.target, await live.trellis.watermarkToken());
    await expectMatchesDefinition(live.db.sql, kept);
  });
});
