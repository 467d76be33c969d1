import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type HeldEvent,
  type StatusEvent,
  Trellis,
  type TrellisEventMap,
} from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type LoggedLine as Line, recordingLogger } from './support/logging.js';
import { type Definition, transformStatement } from './support/oracle.js';
import { migratedTrellis, quietLogger, rejection, waitFor } from './support/trellis.js';

// Issue #12: engine lines reach the app's logger with structured fields, one line per
// state change of a transform (logged by the elected staging worker's process, once for
// the fleet) and next to nothing while healthy; the handle's events tell the same
// changes to any process listening.

let db: TestDatabase;

beforeAll(async () => {
  db = await freshDatabase();
  const migrator = await migratedTrellis(db);
  await migrator.shutdown();
});

describe('log lines and events of state changes', () => {
  let worker: Trellis;
  let watcher: Trellis;
  const lines: Line[] = [];
  /**
   * Waits until the worker's process has compared a catalog snapshot whose read began
   * after `since` (Date.now()), as the process that logs changes: every change the catalog
   * held by then has been logged (src/engine/observe/catalog-watch.ts).
   */
  const comparedAfter = (since: number) =>
    waitFor(
      async () =>
        lines.some(
          (l) =>
            l.msg === 'catalog snapshot compared' &&
            l.obj.logging === true &&
            (l.obj.readStartedAt as number) > since,
        ),
      'a look at the catalog after the last change',
    );
  const watcherLines: Line[] = [];
  const events: Array<{ name: keyof TrellisEventMap; event: unknown; at: number }> = [];

  beforeAll(async () => {
    worker = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 2,
      quarantineThreshold: 3,
      logger: recordingLogger(lines),
      // Its disruption is trigger capture's (triggers disabled outside Trellis): with
      // triggers whatever the suite's capture is (WAL capture's are in wal-disruptions).
      capture: 'trigger',
    });
    // Another process's handle, running nothing: it hears the changes the worker makes.
    watcher = await Trellis.connect({ url: db.url, logger: recordingLogger(watcherLines) });
    for (const name of ['status', 'held', 'captureFailure'] as const) {
      watcher.on(name, (event) => {
        events.push({ name, event, at: Date.now() });
      });
    }
    // The elected staging worker's process logs changes from its second look at the
    // catalog on (what it saw at its first was the previous leader's to log): a transform
    // logged here, defined or live, says it logs, so the tests' own are logged whole.
    await db.sql.unsafe('CREATE TABLE le_ready_src (id int PRIMARY KEY)');
    await worker.apply(
      transformStatement({ target: 'le_ready', from: 'le_ready_src', select: 'id AS v' }),
    );
    await waitFor(
      async () => lines.some((l) => l.obj.target === 'le_ready' && l.level !== 'debug'),
      'the worker to log state changes',
    );
    // A listener that throws: logged, and the others still hear every event.
    watcher.on('status', () => {
      throw new Error('listener down');
    });
  });
  afterAll(async () => {
    await watcher?.shutdown();
    await worker?.shutdown();
  });

  const statusEvents = (target: string) =>
    events
      .filter((e) => e.name === 'status' && (e.event as StatusEvent).target === target)
      .map((e) => e.event as StatusEvent);

  const linesFor = (target: string) =>
    lines.filter((l) => l.obj.target === target && l.level !== 'debug');

  it('logs a transform going live, paused and resumed, one line each, with its fields', async () => {
    await db.sql.unsafe(`
      CREATE TABLE le_src (id int PRIMARY KEY, a int NOT NULL);
      INSERT INTO le_src SELECT i, i FROM generate_series(1, 100) i;`);
    const d: Definition = { target: 'le_v', from: 'le_src', select: 'a', implicit: 'id' };
    await worker.apply(transformStatement(d));
    // (`transform le_v is live`, or `defined: live` when it got there between two looks.)
    await waitFor(
      async () => linesFor('le_v').some((l) => l.obj.status === 'live'),
      'the live line',
    );
    await worker.apply('PAUSE TRANSFORM le_v');
    await waitFor(
      async () => linesFor('le_v').some((l) => l.msg.includes('paused')),
      'the pause line',
    );
    // (Events come from looks at the catalog a second apart: a pause undone sooner could
    // go unseen.)
    await waitFor(
      async () => statusEvents('le_v').some((e) => e.status === 'paused'),
      'the pause event',
    );
    await worker.apply('RESUME TRANSFORM le_v');
    await waitFor(
      async () => linesFor('le_v').some((l) => l.msg.startsWith('transform le_v resumed')),
      'the resume line',
    );
    const mine = linesFor('le_v');
    const paused = mine.filter((l) => l.msg.includes('paused'));
    expect(paused).toHaveLength(1);
    expect(paused[0]).toMatchObject({
      level: 'info',
      msg: 'transform le_v paused by an operator',
      obj: { target: 'le_v', status: 'paused', reason: 'operator' },
    });
    expect(mine[0]!.msg).toMatch(/^transform le_v defined: /);
    for (const line of mine) {
      expect(line.obj.trellis_instance).toBe(worker.instance);
      expect(['info', 'warn']).toContain(line.level);
    }
    // The watcher heard the same changes, and logged none of them (the staging worker's
    // process logs them, once for the fleet).
    await waitFor(
      async () => statusEvents('le_v').some((e) => e.previous === 'paused'),
      'the resume event',
    );
    const seen = statusEvents('le_v').map((e) => e.status);
    expect(seen).toContain('live');
    expect(seen).toContain('paused');
    expect(statusEvents('le_v').find((e) => e.status === 'paused')?.pauseReason).toBe('operator');
    expect(watcherLines.filter((l) => l.obj.target === 'le_v')).toEqual([]);
    expect(
      watcherLines.some(
        (l) => l.level === 'warn' && l.msg === 'a listener of the status event failed',
      ),
    ).toBe(true);
  });

  it('logs nothing at info while healthy writes flow', async () => {
    await waitFor(async () => (await worker.status('le_v')).status === 'live', 'le_v live');
    // The last state changes logged first: a look at the catalog that began after.
    await comparedAfter(Date.now());
    const from = Date.now();
    // Writes one after another, each through the pipeline before the next (so they span
    // many ticks and drain passes).
    for (let i = 0; i < 30; i += 1) {
      await db.sql`UPDATE le_src SET a = a + 1 WHERE id = ${(i % 100) + 1}`;
      await worker.awaitConverged('le_v', await worker.watermarkToken());
    }
    // Whatever the writes changed is logged by a look that began after them.
    await comparedAfter(Date.now());
    expect(lines.filter((l) => l.at >= from && l.level !== 'debug')).toEqual([]);
  });

  it('logs a disruption and a quarantine pause once each, as warnings, and tells them as events', async () => {
    await db.sql.unsafe(`
      CREATE TABLE le_div (id int PRIMARY KEY, a numeric NOT NULL, b numeric NOT NULL);
      INSERT INTO le_div SELECT i, i, 1 FROM generate_series(1, 50) i;`);
    const q: Definition = {
      target: 'le_q',
      from: 'le_div',
      select: 'a / b AS ratio, a',
      implicit: 'id',
    };
    await worker.apply(transformStatement(q));
    await waitFor(async () => (await worker.status('le_q')).status === 'live', 'le_q live');
    await db.sql`UPDATE le_div SET b = 0 WHERE id <= 4`;
    await waitFor(
      async () => lines.some((l) => l.msg === 'column le_q.ratio paused (quarantine)'),
      'the quarantine pause line',
    );
    const pause = lines.find((l) => l.msg === 'column le_q.ratio paused (quarantine)')!;
    expect(pause).toMatchObject({
      level: 'warn',
      obj: { target: 'le_q', address: 'le_q.ratio', reason: 'quarantine' },
    });
    const held = lines.filter((l) => l.msg.startsWith('key held at le_q.ratio'));
    expect(held.length).toBeGreaterThanOrEqual(3);
    expect(held[0]!.obj).toMatchObject({
      target: 'le_q',
      address: 'le_q.ratio',
      sqlstate: '22012',
    });
    await waitFor(
      async () =>
        events.some((e) => e.name === 'held' && (e.event as HeldEvent).address === 'le_q.ratio'),
      'a held event',
    );
    await waitFor(
      async () => statusEvents('le_q').some((e) => e.pausedColumns.includes('le_q.ratio')),
      'the status event of the paused column',
    );

    // Capture disabled outside Trellis: the transform stops, one warning says why.
    await db.sql.unsafe('ALTER TABLE le_src DISABLE TRIGGER ALL');
    await db.sql`UPDATE le_src SET a = a + 1 WHERE id = 1`;
    await waitFor(
      async () =>
        linesFor('le_v').some((l) => l.msg.startsWith('transform le_v paused (disruption)')),
      'the disruption line',
      20_000,
    );
    const stop = linesFor('le_v').filter((l) => l.msg.startsWith('transform le_v paused'));
    expect(stop.at(-1)).toMatchObject({
      level: 'warn',
      obj: { target: 'le_v', reason: 'disruption', kind: 'disruption' },
    });
    expect(stop.at(-1)!.msg).toContain('was disabled');
    await waitFor(
      async () => events.some((e) => e.name === 'captureFailure'),
      'the captureFailure event',
    );
    const failure = events.find((e) => e.name === 'captureFailure')!
      .event as TrellisEventMap['captureFailure'];
    expect(failure.target).toBe('le_v');
    expect(failure.captureFailure.kind).toBe('disruption');
    // One line for the one change, however many passes saw it: two more looks at the
    // catalog, begun after the line, log nothing more.
    await comparedAfter(Date.now());
    await comparedAfter(Date.now());
    expect(
      linesFor('le_v').filter((l) => l.msg.startsWith('transform le_v paused (disruption)')),
    ).toHaveLength(1);
  });

  it('refuses unknown events and non-function listeners with validation', async () => {
    const unknown = await rejection(
      (async () => watcher.on('nope' as 'status', () => undefined))(),
    );
    expect(unknown.code).toBe('validation');
    const notAFunction = await rejection(
      (async () => watcher.on('status', 42 as unknown as () => void))(),
    );
    expect(notAFunction.code).toBe('validation');
    // The quiet logger is fine as ever.
    await using plain = await Trellis.connect({ url: db.url, logger: quietLogger });
    expect(plain.on('held', () => undefined)).toBe(plain);
  });
});
