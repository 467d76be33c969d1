import { describe, expect, it } from 'vitest';
import { sqlClient } from './support/database.js';
import { livePipeline } from './support/live.js';
import { type Definition, transformStatement } from './support/oracle.js';
import { rejection, waitFor, waitForStatus } from './support/trellis.js';

// Row level security on a source (issue #21, item 10; ADR 0034): a target holds every row
// the engine's role reads, and every role that may read the target reads them all,
// whatever the source's policies say (as with a materialized view). So a definition over
// such a source is refused unless it says WITHOUT ROW SECURITY, status() and definitions()
// show it, and a source that gains row level security later stops its readers.

const live = livePipeline();
const limited = `trellis_rls_limited_${process.pid}_${Date.now().toString(36)}`;

describe('row level security on a source', () => {
  it('refuses a source with row level security unless the definition says WITHOUT ROW SECURITY, and shows it', async () => {
    const { sql } = live.db;
    await sql.unsafe(`
      CREATE ROLE ${limited} LOGIN;
      CREATE TABLE rls_docs (id int PRIMARY KEY, owner text NOT NULL, body text NOT NULL);
      INSERT INTO rls_docs VALUES (1, '${limited}', 'mine'), (2, 'someone', 'theirs'), (3, 'else', 'secret');
      ALTER TABLE rls_docs ENABLE ROW LEVEL SECURITY;
      CREATE POLICY own_rows ON rls_docs FOR SELECT USING (owner = current_user);
      GRANT SELECT ON rls_docs TO ${limited};`);
    const d: Definition = { target: 'rls_doc_bodies', from: 'rls_docs', select: 'owner, body' };

    const refused = await rejection(live.trellis.apply(transformStatement(d)));
    expect(refused).toMatchObject({ code: 'validation' });
    expect(refused.message).toContain('source public.rls_docs has row level security enabled');
    expect(refused.message).toContain('WITHOUT ROW SECURITY');

    await live.trellis.apply(transformStatement({ ...d, options: 'WITHOUT ROW SECURITY' }));
    await waitForStatus(live.trellis, d.target, 'live');
    const status = await live.trellis.status(d.target);
    expect(status.rowSecurity).toEqual([
      { table: 'public.rls_docs', forced: false, optedOut: true },
    ]);
    const definition = (await live.trellis.definitions()).find((x) => x.target === d.target);
    expect(definition?.options).toEqual({ withoutSourceIndex: false, withoutRowSecurity: true });
    expect(definition?.statement).toBe(
      'TRANSFORM rls_doc_bodies FROM public.rls_docs SELECT owner AS owner, body AS body WITHOUT ROW SECURITY',
    );

    // What the opt-in accepts, as README says: the policy limits the role on the source,
    // not on the target.
    await sql.unsafe(`GRANT SELECT ON rls_doc_bodies TO ${limited}`);
    const url = new URL(live.db.url);
    url.username = limited;
    url.password = '';
    const asLimited = sqlClient(url.toString(), { max: 1 });
    try {
      expect(await asLimited`SELECT body FROM rls_docs ORDER BY id`).toEqual([{ body: 'mine' }]);
      const all = await asLimited`SELECT body FROM rls_doc_bodies ORDER BY body`;
      expect(all.map((r) => r.body)).toEqual(['mine', 'secret', 'theirs']);
    } finally {
      await asLimited.end();
    }

    // Taking the opt-in back is refused while the source has row level security.
    const reset = await rejection(
      live.trellis.apply('ALTER TRANSFORM rls_doc_bodies RESET WITHOUT ROW SECURITY'),
    );
    expect(reset).toMatchObject({ code: 'validation' });
  });

  it('stops a transform whose source gains row level security, until it is defined WITHOUT ROW SECURITY and resumed', async () => {
    const { sql } = live.db;
    await sql.unsafe(`
      CREATE TABLE rls_notes (id int PRIMARY KEY, body text NOT NULL);
      INSERT INTO rls_notes SELECT i, 'note ' || i FROM generate_series(1, 20) i;`);
    const d: Definition = { target: 'rls_note_bodies', from: 'rls_notes', select: 'body' };
    await live.define(d);
    expect((await live.trellis.status(d.target)).rowSecurity).toEqual([]);

    await sql.unsafe(`ALTER TABLE rls_notes ENABLE ROW LEVEL SECURITY`);
    const stopped = await waitForStatus(live.trellis, d.target, 'paused');
    expect(stopped.pauseReason).toBe('capture_failure');
    expect(stopped.captureFailure?.error).toContain(
      'row level security was enabled on public.rls_notes',
    );
    expect(stopped.rowSecurity).toEqual([
      { table: 'public.rls_notes', forced: false, optedOut: false },
    ]);

    const refused = await rejection(live.trellis.apply('RESUME TRANSFORM rls_note_bodies'));
    expect(refused).toMatchObject({ code: 'validation' });
    expect(refused.message).toContain('row level security');

    await live.trellis.apply('ALTER TRANSFORM rls_note_bodies SET WITHOUT ROW SECURITY');
    await live.trellis.apply('RESUME TRANSFORM rls_note_bodies');
    await waitForStatus(live.trellis, d.target, 'live');
    await sql.unsafe(`INSERT INTO rls_notes VALUES (21, 'note 21')`);
    await live.converged({ ...d, implicit: 'id' });
    const status = await live.trellis.status(d.target);
    expect(status.rowSecurity).toEqual([
      { table: 'public.rls_notes', forced: false, optedOut: true },
    ]);
    expect(status.captureFailure).toBeNull();

    // An opted-in transform is not stopped by FORCE ROW LEVEL SECURITY either.
    await sql.unsafe(`ALTER TABLE rls_notes FORCE ROW LEVEL SECURITY`);
    await waitFor(
      async () => (await live.trellis.status(d.target)).rowSecurity[0]?.forced === true,
      'status() to show the forced row level security',
    );
    await sql.unsafe(`INSERT INTO rls_notes VALUES (22, 'note 22')`);
    await live.converged({ ...d, implicit: 'id' });
    expect((await live.trellis.status(d.target)).status).toBe('live');
  });
});
