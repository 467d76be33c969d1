import type postgres from 'postgres';
import { bulkFigures } from './alternatives-bulk.js';
import { freshnessFigures } from './alternatives-freshness.js';
import { type Contenders, contenders, SHAPES } from './alternatives-variants.js';
import { writeFigures } from './alternatives-writes.js';
import { type Figure, PartialFailure, type Scenario } from './scenario.js';
import { type BenchDb, benchDatabase, dropBenchDatabase } from './support.js';

/**
 * Issue #14 item 5: for one workload — `sum(amount), count(*) GROUP BY customer_id` over an
 * orders table, with 10,000 groups and with 10 hot ones — every way of keeping the
 * aggregate, measured side by side in one run (alternatives-variants.ts):
 * bare; trellis-pg with trigger capture and with WAL capture, each with its drain stopped
 * (what capture costs writers) and running on the same cores; a hand-written synchronous
 * trigger; REFRESH MATERIALIZED VIEW CONCURRENTLY every second. Figures: single-row
 * INSERT/UPDATE throughput at 8 clients and one 100k-row INSERT … SELECT against bare, and
 * commit → visible at 1,000 writes/s. `npm run bench` draws them (bench/charts.ts).
 */
export const alternatives: Scenario = {
  name: 'alternatives',
  title:
    'Side by side: trellis-pg (trigger, WAL capture), a hand-written trigger, a refreshed matview, bare',
  // WAL capture's slot; a second database holds its instance (capture is instance-wide).
  server: { wal_level: 'logical', max_replication_slots: 10, max_wal_senders: 10 },
  async run({ db, seconds, log }) {
    const [level] = await db.sql<{ wal_level: string }[]>`SHOW wal_level`;
    let wal: BenchDb | null = null;
    if (level?.wal_level === 'logical') wal = await benchDatabase(db.server);
    else log(`wal_level is ${level?.wal_level} on this server: no WAL capture variants`);
    const clients = new Map<string, postgres.Sql>([[db.url, db.sql]]);
    if (wal) clients.set(wal.url, wal.sql);
    const figures: Figure[] = [];
    const phase = async (name: string, work: () => Promise<Figure[]>) => {
      const started = performance.now();
      figures.push(...(await work()));
      log(`(${name}: ${((performance.now() - started) / 1000).toFixed(0)} s)`);
    };
    let c: Contenders | undefined;
    try {
      c = await contenders(db.sql, db.url, wal?.url ?? null);
      const { variants } = c;
      // Hot groups first: the wide shape then stays for the bulk and freshness phases.
      await phase('10 hot groups', () => writeFigures(db, variants, SHAPES.hot, seconds, log));
      await phase('10,000 groups', () => writeFigures(db, variants, SHAPES.wide, seconds, log));
      await phase('bulk', () => bulkFigures(db, clients, variants, log));
      await phase('freshness', () => freshnessFigures(clients, variants, log));
    } catch (error) {
      // Ten minutes of figures are worth keeping when a later phase fails.
      throw new PartialFailure(figures, error);
    } finally {
      await c?.close();
      if (wal) await dropBenchDatabase(wal);
    }
    return figures;
  },
};
