import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { TEST_CAPTURE, waitUntilOnTheSlot } from './support/capture-mode.js';
import { CLI_COMMAND, trellisInProcess } from './support/cli.js';
import { freshDatabase } from './support/database.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis, waitFor } from './support/trellis.js';

// `trellis status --watch` in a pseudo-terminal (util-linux `script` gives the CLI one):
// the table is redrawn in place, and the backfill's progress bar advances frame by frame.

const copy: Definition = { target: 'big_copy', from: 'big', select: 'v', implicit: 'id' };

const ANSI = new RegExp(`${String.fromCharCode(27)}\\[[0-9;?]*[A-Za-z]`, 'g');
const shellQuote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

describe('trellis status --watch', { timeout: 180_000 }, () => {
  it('redraws the table in place on a terminal, with a progress bar that advances', async () => {
    const db = await freshDatabase();
    // Three backfill chunks (100,000 keys each), and an estimate of the total to show.
    await db.sql`CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL)`;
    await db.sql`INSERT INTO big SELECT g, g % 1000 FROM generate_series(1, 300000) g`;
    await db.sql`ANALYZE big`;
    await using trellis = await migratedTrellis(db);
    await trellis.apply(transformStatement(copy));

    const command = [...CLI_COMMAND, 'status', '--watch', '--interval', '50', '--until', 'live']
      .concat(['--url', db.url])
      .map(shellQuote)
      .join(' ');
    const terminal = spawn(
      'script',
      ['-qfec', `stty cols 160 rows 40; exec ${command}`, '/dev/null'],
      {
        env: { ...process.env, NO_COLOR: undefined, DATABASE_URL: undefined },
        stdio: ['pipe', 'pipe', 'pipe'],
      },
    );
    let screen = '';
    terminal.stdout.on('data', (chunk: Buffer) => {
      screen += chunk.toString();
    });
    const exited = new Promise<number | null>((resolve) => terminal.on('exit', resolve));
    try {
      await waitFor(async () => screen.includes('waiting_to_backfill'), 'the first frame', 30_000);
      // Now the workers: the watcher sees the backfill start, advance and finish.
      await using worker = await migratedTrellis(db, { staging: true, drainThreads: 1 });
      expect(await exited).toBe(0);
      await worker.awaitConverged('big_copy', await worker.watermarkToken());
    } finally {
      terminal.kill('SIGKILL');
    }

    // Redrawn in place: log-update erases the previous frame's lines before each new one.
    expect(screen).toContain('\x1b[2K');
    // Each time the row is drawn (log-update rewrites only the lines that changed).
    const frames = [...screen.replace(ANSI, '').matchAll(/big_copy {2}[^\n]*/g)].map((m) => m[0]);
    const backfilling = frames
      .map((line) => /backfilling\s.*?([░█]{20}) (\d+)% ([\d,]+)\/([\d,]+) keys/.exec(line))
      .filter((m) => m !== null)
      .map((m) => ({
        filled: [...m[1]!].filter((ch) => ch === '█').length,
        percent: Number(m[2]),
        done: Number(m[3]!.replaceAll(',', '')),
      }));
    // At least two distinct points of the backfill, in order, the bar growing with them.
    const distinct = [...new Set(backfilling.map((b) => b.done))];
    expect(distinct.length, `frames seen: ${JSON.stringify(frames)}`).toBeGreaterThanOrEqual(2);
    expect(distinct).toEqual([...distinct].sort((a, b) => a - b));
    const first = backfilling[0]!;
    const last = backfilling[backfilling.length - 1]!;
    expect(last.percent).toBeGreaterThan(first.percent);
    expect(last.filled).toBeGreaterThan(first.filled);
    expect(frames[frames.length - 1]).toMatch(/^big_copy\s+live\s/);
    expect(frames[0]).toMatch(/^big_copy\s+waiting_to_backfill\s/);
    await expectMatchesDefinition(db.sql, copy);

    // Under WAL capture the source leaves its trigger after live, which the line would
    // show as a wait: once it is on the slot alone, nothing is left waiting.
    if (TEST_CAPTURE === 'logical') await waitUntilOnTheSlot(db.sql);
    // Piped: one timestamped plain line per change; --json: one object a line.
    const piped = await trellisInProcess(['status', '--watch', '--until', 'live', '--url', db.url]);
    expect(piped.code).toBe(0);
    expect(piped.stdout).toMatch(/^\d{4}-\d\d-\d\dT[\d:.]+Z big_copy live lag=- held=0\n$/);
    const json = await trellisInProcess([
      'status',
      '--watch',
      '--json',
      '--until',
      'live',
      '--url',
      db.url,
    ]);
    const reads = json.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line));
    expect(reads).toEqual([
      {
        at: expect.any(String),
        transforms: [expect.objectContaining({ target: 'big_copy', status: 'live' })],
      },
    ]);
  });
});
