import { loadavg } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import postgres from 'postgres';
import { type Figure, figure, type Scenario } from './scenario.js';
import { trellisOn } from './support.js';

/**
 * `redefine` (issue #25 item 1, ADR 0055): how long `ALTER TRANSFORM t AS …` holds the
 * target's lock when it switches to the new definition, and the longest a reader polling
 * the target waited meanwhile, against how long the new definition took to build (what a
 * DROP TRANSFORM and define again would leave readers without the target for). Three
 * switches over BENCH_REDEFINE_ROWS source rows (default 100000): a filter changed (no DDL:
 * an EXCLUSIVE lock, readers go on), columns added and dropped (ACCESS EXCLUSIVE), and a
 * GROUP BY given another key (the key constraint replaced, every row written again). Targets:
 * the lock held for at most half the build; the ACCESS EXCLUSIVE part of it (readers wait),
 * which a staged switch holds for metadata only (ADR 0055's addendum), at most a tenth.
 */
export const redefine: Scenario = {
  name: 'redefine',
  title: 'Redefinition in place: the switch lock against the build of the new definition',
  async run({ db, log }) {
    const rows = Number(process.env.BENCH_REDEFINE_ROWS ?? 100_000);
    await db.sql.unsafe(`
      CREATE TABLE rb_src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL, note text NOT NULL);
      INSERT INTO rb_src SELECT g, g % 1000, g % 97, 'row ' || g FROM generate_series(1, ${rows}) g;`);
    await db.sql.unsafe('VACUUM ANALYZE rb_src');
    const n = rows.toLocaleString('en-US');
    const shapes = [
      {
        name: `a filter changed (${n} rows)`,
        before: 'TRANSFORM rb_t FROM rb_src SELECT id, v, note WHERE v > 10',
        after: 'ALTER TRANSFORM rb_t AS FROM rb_src SELECT id, v, note WHERE v > 20',
      },
      {
        name: `a column added and one dropped (${n} rows)`,
        before: 'TRANSFORM rb_t FROM rb_src SELECT id, v, note',
        after: 'ALTER TRANSFORM rb_t AS SELECT id, v, v * 2 AS v2 FROM rb_src',
      },
      {
        name: `a GROUP BY given another key (${n} rows)`,
        before:
          'TRANSFORM rb_t FROM rb_src SELECT grp, count(*) AS n, sum(v) AS total GROUP BY grp',
        after: 'ALTER TRANSFORM rb_t AS FROM rb_src SELECT v, count(*) AS n GROUP BY v',
      },
    ];
    const figures: Figure[] = [];
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    const reader = postgres(db.url, { max: 1, onnotice: () => undefined });
    try {
      for (const shape of shapes) {
        await trellis.define(shape.before);
        await waitUntil(db.sql, `live 'rb_t'`, async () => {
          const [row] = await db.sql<{ phase: string }[]>`
            SELECT p.phase FROM trellis.pipeline p JOIN trellis.transforms t ON t.id = p.transform_id
             WHERE t.target_name = 'rb_t' AND t.redefines IS NULL`;
          return row?.phase === 'live';
        });
        // A reader polling the target the whole time: the longest read is what the switch
        // made a reader wait.
        let reading = true;
        let longest = 0;
        let reads = 0;
        const polling = (async () => {
          while (reading) {
            const started = performance.now();
            await reader`SELECT count(*) FROM rb_t`;
            longest = Math.max(longest, performance.now() - started);
            reads += 1;
            await sleep(1);
          }
        })();
        const started = performance.now();
        await trellis.apply(shape.after);
        let built = 0;
        await waitUntil(db.sql, 'the switch', async () => {
          const [row] = await db.sql<{ state: string | null; phase: string | null }[]>`
            SELECT t.redefinition->>'state' AS state,
                   (SELECT p.phase FROM trellis.transforms x JOIN trellis.pipeline p ON p.transform_id = x.id
                     WHERE x.redefines = t.id) AS phase
              FROM trellis.transforms t WHERE t.target_name = 'rb_t' AND t.redefines IS NULL`;
          if (row?.phase === 'live' && built === 0) built = performance.now() - started;
          if (row?.state === 'failed') throw new Error('the redefinition failed');
          return row?.state === 'switched';
        });
        const total = performance.now() - started;
        reading = false;
        await polling;
        const [done] = await db.sql<
          {
            lock_ms: string;
            readers_ms: string | null;
            staged: boolean | null;
            deleted: string;
            written: string;
          }[]
        >`
          SELECT redefinition->>'lockMs' AS lock_ms, redefinition->>'readersBlockedMs' AS readers_ms,
                 (redefinition->>'staged')::boolean AS staged,
                 redefinition->>'deleted' AS deleted, redefinition->>'written' AS written
            FROM trellis.transforms WHERE target_name = 'rb_t'`;
        const lockMs = Number(done!.lock_ms);
        // ACCESS EXCLUSIVE (readers wait): what ADR 0055's addendum bounds.
        const readersMs = Number(done!.readers_ms ?? done!.lock_ms);
        if (built === 0) built = total;
        log(
          `${shape.name}: lock ${lockMs.toFixed(1)} ms (readers blocked ${readersMs.toFixed(1)} ms, staged ${done!.staged}), longest read ${longest.toFixed(1)} ms over ${reads} reads, build ${built.toFixed(0)} ms, switched after ${total.toFixed(0)} ms (rows deleted ${done!.deleted}, written ${done!.written}; load ${loadavg()[0]!.toFixed(1)})`,
        );
        figures.push(
          figure({
            scenario: 'redefine',
            figure: `switch lock readers wait for (ACCESS EXCLUSIVE), ${shape.name}`,
            value: readersMs,
            unit: 'ms',
            baseline: { label: 'build of the new definition', value: built },
            target: { of: 'ratio', op: '<=', threshold: 0.1, text: '≤ 0.1× the build' },
            detail: { staged: done!.staged, load: loadavg()[0] },
          }),
        );
        figures.push(
          figure({
            scenario: 'redefine',
            figure: `switch lock, ${shape.name}`,
            value: lockMs,
            unit: 'ms',
            baseline: { label: 'build of the new definition', value: built },
            target: { of: 'ratio', op: '<=', threshold: 0.5, text: '≤ 0.5× the build' },
            detail: {
              longestReadMs: longest,
              reads,
              switchedAfterMs: total,
              deleted: Number(done!.deleted),
              written: Number(done!.written),
              load: loadavg()[0],
            },
          }),
        );
        figures.push(
          figure({
            scenario: 'redefine',
            figure: `longest read during the redefinition, ${shape.name}`,
            value: longest,
            unit: 'ms',
          }),
        );
        await trellis.apply('DROP TRANSFORM rb_t');
      }
    } finally {
      await reader.end({ timeout: 5 });
      await trellis.shutdown();
    }
    return figures;
  },
};

async function waitUntil(
  _sql: postgres.Sql,
  what: string,
  check: () => Promise<boolean>,
  timeoutMs = 600_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(10);
  }
  throw new Error(`timed out waiting for ${what}`);
}
