import { describe, expect, it } from 'vitest';
import { sqlClient } from './support/database.js';
import { livePipeline } from './support/live.js';
import { type Definition, transformStatement } from './support/oracle.js';
import { waitFor, waitForStatus } from './support/trellis.js';

// Rows that arrive or leave without DML (issue #9): ATTACH and DETACH PARTITION, a
// partition dropped, INHERIT and NO INHERIT. Capture sees none of them; the staging
// worker notices and corrects, while writes keep flowing.

const live = livePipeline();

/** Inserts into `table` until stopped; any error fails the test. */
function keepWriting(table: string, from: number): () => Promise<void> {
  const sql = sqlClient(live.db.url, { max: 1 });
  let stopped = false;
  const done = (async () => {
    for (let id = from; !stopped; id += 1) {
      await sql.unsafe(`INSERT INTO ${table} (id, kind, amount) VALUES (${id}, 'w', ${id % 50})`);
      // Pacing: the inserts spread over the change, not a wait for anything.
      await new Promise((resolve) => setTimeout(resolve, 5)); // pacing of the writer
    }
  })();
  return async () => {
    stopped = true;
    await done;
    await sql.end({ timeout: 2 });
  };
}

describe('partitions and children whose rows come or go without DML', () => {
  it('corrects an attached partition (reported while it does), a detached one, and a dropped one', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE events (id int NOT NULL, kind text NOT NULL, amount int NOT NULL, PRIMARY KEY (id))
        PARTITION BY RANGE (id);
      CREATE TABLE events_live PARTITION OF events FOR VALUES FROM (0) TO (100000);
      CREATE TABLE events_old PARTITION OF events FOR VALUES FROM (-100000) TO (0);
      INSERT INTO events SELECT i, 'k' || (i % 5), i % 100 FROM generate_series(-500, 2000) i;
      CREATE TABLE events_archive (id int NOT NULL, kind text NOT NULL, amount int NOT NULL, PRIMARY KEY (id));
      INSERT INTO events_archive SELECT i, 'archived', i % 7 FROM generate_series(100000, 139999) i;`);
    const rows: Definition = {
      target: 'event_rows',
      from: 'events',
      select: 'kind, amount',
      where: 'amount > 3',
      implicit: 'id',
    };
    const totals: Definition = {
      target: 'event_totals',
      from: 'events',
      select: 'kind, sum(amount) AS total, count(*) AS n',
      groupBy: 'kind',
    };
    for (const d of [rows, totals]) {
      await live.trellis.apply(transformStatement(d));
      await waitForStatus(live.trellis, d.target, 'live');
    }
    // Each change is made while a writer keeps inserting; the target is compared with its
    // definition once the writer has stopped (its later rows are not in the token).
    let stop = keepWriting('events', 5000);
    try {
      await live.db
        .sql`ALTER TABLE events ATTACH PARTITION events_archive FOR VALUES FROM (100000) TO (200000)`;
      // 40,000 keys go in chunks: the correction is seen while it runs.
      await waitFor(
        async () => (await live.trellis.status(rows.target)).correcting.length > 0,
        'the correction to be reported',
      );
      const status = await live.trellis.status(rows.target);
      expect(status.status).toBe('backfilling');
      expect(status.correcting[0]).toMatchObject({ node: 'public.events_archive' });
      expect(status.correcting[0]!.since).toBeInstanceOf(Date);
    } finally {
      await stop();
    }
    await live.converged([rows, totals]);
    expect((await live.trellis.status(rows.target)).correcting).toEqual([]);

    stop = keepWriting('events', 10_000);
    try {
      await live.db.sql`ALTER TABLE events DETACH PARTITION events_old`;
      // The detached table's later writes are no longer the source's.
      await live.db.sql`UPDATE events_old SET amount = 99`;
    } finally {
      await stop();
    }
    await live.converged([rows, totals]);

    stop = keepWriting('events', 20_000);
    try {
      await live.db.sql`DROP TABLE events_archive`;
    } finally {
      await stop();
    }
    await live.converged([rows, totals]);
  });

  it('corrects a child that starts or stops inheriting', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE animals (id int PRIMARY KEY, kind text NOT NULL, amount int NOT NULL);
      INSERT INTO animals SELECT i, 'animal', i FROM generate_series(1, 100) i;
      CREATE TABLE cats (id int PRIMARY KEY, kind text NOT NULL, amount int NOT NULL);
      INSERT INTO cats SELECT i, 'cat', i FROM generate_series(1000, 1200) i;`);
    const d: Definition = {
      target: 'animal_rows',
      from: 'animals',
      select: 'kind, amount',
      implicit: 'id',
    };
    await live.trellis.apply(transformStatement(d));
    await waitForStatus(live.trellis, d.target, 'live');
    await live.db.sql`ALTER TABLE cats INHERIT animals`;
    await live.converged([d]);
    await live.db.sql`INSERT INTO cats VALUES (2000, 'kitten', 1)`;
    await live.converged([d]);
    await live.db.sql`ALTER TABLE cats NO INHERIT animals`;
    await live.converged([d]);
  });
});
