import { beforeAll, describe, expect, it } from 'vitest';
import { Trellis } from '../src/engine/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type LoggedLine as Line, recordingLogger } from './support/logging.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { scrape } from './support/prometheus.js';
import { migratedTrellis, waitFor } from './support/trellis.js';

// Issue #12: a logger that throws or blocks never holds the engine up: lines reach it
// through a bounded buffer, are dropped past it, and a warning says how many.

let db: TestDatabase;

beforeAll(async () => {
  db = await freshDatabase();
  const migrator = await migratedTrellis(db);
  await migrator.shutdown();
});

/** A table of `rows` rows, one in ten with b = 0, and a transform dividing by b: a flood of held keys. */
async function failingScene(name: string, rows: number): Promise<Definition> {
  await db.sql.unsafe(`
    CREATE TABLE ${name} (id int PRIMARY KEY, a numeric NOT NULL, b numeric NOT NULL);
    INSERT INTO ${name} SELECT i, i, CASE WHEN i % 10 = 0 THEN 0 ELSE 1 END FROM generate_series(1, ${rows}) i;`);
  return { target: `${name}_v`, from: name, select: 'a / b AS ratio', implicit: 'id' };
}

/** The flood: every bad row's key is held, and logged (one warn line each). */
async function flood(trellis: Trellis, d: Definition, bad: number): Promise<number> {
  const started = Date.now();
  await trellis.apply(transformStatement(d));
  await waitFor(
    async () => (await trellis.status(d.target)).heldKeys >= bad,
    `${bad} keys held at ${d.target}`,
    // Generous: on a loaded machine the build alone can take tens of seconds. What shows
    // the engine was not held up is the time against the logger's (asserted by callers).
    90_000,
  );
  await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 60_000 });
  return Date.now() - started;
}

describe('a logger that misbehaves', () => {
  it('throws on every line: the engine goes on', async () => {
    const explode = () => {
      throw new Error('logger down');
    };
    await using trellis = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 2,
      quarantineThreshold: 5_000,
      logger: { debug: explode, info: explode, warn: explode, error: explode },
    });
    const d = await failingScene('lx_throw', 300);
    await flood(trellis, d, 30);
    expect((await trellis.status(d.target)).heldKeys).toBe(30);
    await db.sql`UPDATE lx_throw SET b = 1 WHERE b = 0`;
    await trellis.apply(`RESUME TRANSFORM ${d.target}`);
    await trellis.awaitConverged(d.target, await trellis.watermarkToken(), { timeoutMs: 20_000 });
    await expectMatchesDefinition(db.sql, d);
  });

  it('takes seconds per line (a promise): lines are dropped, one warning says how many, the engine is not held up', {
    timeout: 180_000,
  }, async () => {
    const lines: Line[] = [];
    // Each line takes 3 s: the 60-odd lines below would take minutes to hand over one by one.
    const slow = recordingLogger(lines, () => new Promise((resolve) => setTimeout(resolve, 3_000))); // a slow log sink, not a wait
    const trellis = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 2,
      quarantineThreshold: 5_000,
      logger: slow,
      logBufferLines: 20,
    });
    try {
      const d = await failingScene('lx_async', 600);
      const took = await flood(trellis, d, 60);
      // Handed over one by one, the 60-odd lines alone would take three minutes.
      expect(took).toBeLessThan(90_000);
      // Calls answer as usual meanwhile.
      const started = Date.now();
      expect((await trellis.status(d.target)).heldKeys).toBe(60);
      expect(Date.now() - started).toBeLessThan(2_000);
      await waitFor(
        async () => lines.some((l) => typeof l.obj.dropped === 'number'),
        'the drop warning',
        15_000,
      );
      const warning = lines.find((l) => typeof l.obj.dropped === 'number')!;
      expect(warning.level).toBe('warn');
      expect(warning.msg).toMatch(/log lines? (was|were) dropped: the logger fell behind/);
      expect(warning.obj.trellis_instance).toBe(trellis.instance);
      expect(warning.obj.dropped).toBeGreaterThan(0);
      // Counted in the metrics too: a buffer of 20, one line handed over every 3 s, and the
      // flood's lines past that dropped (held keys log the first 10 of a pass one by one,
      // then a summary: ADR 0040, so the flood writes some 40 lines, not one per key).
      const s = await scrape();
      const dropped = s.value('trellis_log_lines_dropped_total', {
        trellis_instance: trellis.instance,
      })!;
      expect(dropped).toBeGreaterThan(5);
      // Each warning says how many went since the one before: never more than were dropped.
      const told = lines
        .filter((l) => typeof l.obj.dropped === 'number')
        .reduce((sum, l) => sum + (l.obj.dropped as number), 0);
      expect(told).toBeLessThanOrEqual(dropped);
    } finally {
      // A logger with a backlog does not hold up shutdown: it waits a second, then drops it.
      const stopping = Date.now();
      await trellis.shutdown();
      expect(Date.now() - stopping).toBeLessThan(8_000);
    }
  });

  it('blocks the thread for a second per line: the engine still gets on, and the drop warning comes', {
    timeout: 180_000,
  }, async () => {
    const lines: Line[] = [];
    const block = () => {
      const until = Date.now() + 1_000;
      while (Date.now() < until) {
        // A synchronous logger stuck on a full pipe, say.
      }
    };
    const trellis = await Trellis.connect({
      url: db.url,
      staging: true,
      drainThreads: 2,
      quarantineThreshold: 5_000,
      logger: recordingLogger(lines, block),
      logBufferLines: 20,
    });
    try {
      const d = await failingScene('lx_sync', 600);
      // Handed over one by one, the lines alone would block the thread for over a minute.
      const took = await flood(trellis, d, 60);
      expect(took).toBeLessThan(60_000);
      await waitFor(
        async () => lines.some((l) => typeof l.obj.dropped === 'number'),
        'the drop warning',
        20_000,
      );
      expect(lines.length).toBeLessThan(30);
    } finally {
      await trellis.shutdown();
    }
  });
});
