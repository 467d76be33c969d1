import type { Trellis } from '../src/engine/index.js';
import { snapshotSql } from '../src/engine/observe/catalog-snapshot.js';
import { type Figure, figure, type Scenario } from './scenario.js';
import { converge, median, timed, trellisOn } from './support.js';

/**
 * What a Prometheus scrape costs the database (issue #12, ADR 0016): the catalog snapshot
 * statement every scrape runs once per instance, with 1, 10 and 100 live transforms,
 * against one status() call of one transform (the read an operator would otherwise poll).
 * Then a whole renderPrometheus() with 100 transforms, from the app's side.
 */
const COUNTS = [1, 10, 100];
const RUNS = 21;

async function defineProjections(
  db: { sql: import('postgres').Sql },
  trellis: Trellis,
  from: number,
  to: number,
) {
  for (let n = from; n <= to; n += 1) {
    await db.sql.unsafe(`
      CREATE TABLE scrape_s${n} (id int PRIMARY KEY, a int NOT NULL);
      INSERT INTO scrape_s${n} SELECT g, g FROM generate_series(1, 100) g;`);
    await trellis.define(`TRANSFORM scrape_v${n} FROM scrape_s${n} SELECT a`);
  }
  for (let n = from; n <= to; n += 1) await converge(trellis, `scrape_v${n}`);
}

export const scrape: Scenario = {
  name: 'scrape',
  title: 'scrape: the catalog snapshot a Prometheus scrape reads, by live transforms',
  async run({ db, log }) {
    const figures: Figure[] = [];
    const trellis = await trellisOn(db.url, { staging: true, drainThreads: 2 });
    try {
      const sql = snapshotSql('trellis');
      let defined = 0;
      for (const count of COUNTS) {
        await defineProjections(db, trellis, defined + 1, count);
        defined = count;
        const snapshot: number[] = [];
        const status: number[] = [];
        for (let i = 0; i < RUNS; i += 1) {
          // As the engine reads it (catalog-snapshot.ts): without JIT.
          snapshot.push(
            await timed(() =>
              db.sql.begin(async (tx) => {
                await tx.unsafe('SET LOCAL jit = off');
                await tx.unsafe(sql);
              }),
            ),
          );
          status.push(await timed(() => trellis.status('scrape_v1')));
        }
        log(
          `${count} transforms: snapshot ${median(snapshot).toFixed(2)} ms, status() ${median(status).toFixed(2)} ms`,
        );
        figures.push(
          figure({
            scenario: 'scrape',
            figure: `catalog snapshot, ${count} live transform${count === 1 ? '' : 's'} (median of ${RUNS})`,
            value: median(snapshot),
            unit: 'ms',
            baseline: { label: 'one status() call', value: median(status) },
            detail: { snapshot, status },
          }),
        );
      }
      // From the app's side: a scrape reads afresh when its last read is over a second old.
      const { renderPrometheus } = await import('../src/engine/index.js');
      const rendered: number[] = [];
      for (let i = 0; i < 5; i += 1) {
        await new Promise((resolve) => setTimeout(resolve, 1_100));
        rendered.push(await timed(() => renderPrometheus()));
      }
      figures.push(
        figure({
          scenario: 'scrape',
          figure: `renderPrometheus(), ${defined} live transforms (median of 5)`,
          value: median(rendered),
          unit: 'ms',
          baseline: { label: 'the snapshot alone', value: figures.at(-1)!.value },
          detail: { rendered },
        }),
      );
    } finally {
      await trellis.shutdown();
    }
    return figures;
  },
};
