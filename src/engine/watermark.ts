import type { Session } from './db/session.js';
import { TrellisError } from './errors.js';
import { quoteIdent } from './identifiers.js';
import { sleep } from './workers/sleep.js';

const PREFIX = 'wm1:';
const SNAPSHOT = /^\d+:\d+:(\d+(,\d+)*)?$/;

/**
 * A token standing for "every write committed so far": the server's current snapshot.
 * Opaque to callers; only awaitConverged reads it.
 */
export async function watermarkToken(session: Session): Promise<string> {
  const [row] = await session.query<{ snap: string }>('SELECT pg_current_snapshot()::text AS snap');
  return `${PREFIX}${row!.snap}`;
}

function snapshotOf(token: string): string {
  const snap =
    typeof token === 'string' && token.startsWith(PREFIX) ? token.slice(PREFIX.length) : '';
  if (!SNAPSHOT.test(snap)) {
    throw new TrellisError(
      'validation',
      'not a watermark token: pass what watermarkToken() returned',
    );
  }
  return snap;
}

interface Progress {
  found: boolean;
  covered: boolean;
  /** No rows came or went without DML that are still to be put into the ledger. */
  settled: boolean;
  upstream: number[];
}

/**
 * Whether transform `id` has applied every write visible in `snap`: its phase is past the
 * backfill and its cursor's tick sees every transaction `snap` sees. A tick sees them
 * when it is not older (xmax) and every transaction it still counts as running was
 * running for `snap` too (or began after it).
 */
async function progress(
  session: Session,
  schema: string,
  target: string | number,
  snap: string,
): Promise<Progress & { id: number }> {
  const s = quoteIdent(schema);
  const byName = typeof target === 'string';
  const [row] = await session.query<{
    id: number;
    covered: boolean;
    settled: boolean;
    upstream: number[];
  }>(
    `SELECT t.id,
            (t.paused_at IS NULL AND p.phase IN ('catching_up', 'live') AND p.cursor_tick IS NOT NULL
             AND EXISTS (
               SELECT 1 FROM ${s}.ticks k
                WHERE k.seq = p.cursor_tick
                  AND pg_snapshot_xmax(k.snap) >= pg_snapshot_xmax($2::pg_snapshot)
                  AND NOT EXISTS (
                    SELECT 1 FROM pg_snapshot_xip(k.snap) x
                     WHERE x < pg_snapshot_xmax($2::pg_snapshot)
                       AND x NOT IN (SELECT pg_snapshot_xip($2::pg_snapshot))))) AS covered,
            -- Rows attached or detached without DML are re-derived too (corrections).
            ${s}._sources_settled(t.id) AS settled,
            ARRAY(SELECT u.id FROM ${s}.transform_sources ts
                    JOIN ${s}.transforms u ON u.target_oid = ts.source_oid
                   WHERE ts.transform_id = t.id) AS upstream
       FROM ${s}.transforms t JOIN ${s}.pipeline p ON p.transform_id = t.id
      WHERE ${byName ? 't.target_name = $1' : 't.id = $1::int'}`,
    [String(target), snap],
  );
  if (!row) {
    if (byName) throw new TrellisError('not_found', `there is no transform named ${target}`);
    return { id: -1, found: false, covered: true, settled: true, upstream: [] };
  }
  return {
    id: row.id,
    found: true,
    covered: row.covered && row.settled,
    settled: row.settled,
    upstream: row.upstream,
  };
}

/**
 * Resolves once every write committed before `token` was taken is reflected in `target`
 * (read-your-writes). For a chain, each upstream transform converges first; the target
 * then converges on a snapshot taken after that, which covers what the upstream wrote.
 */
export async function awaitConverged(
  session: Session,
  schema: string,
  target: string,
  token: string,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const signal = new AbortController().signal;
  const converge = async (t: string | number, snap: string): Promise<void> => {
    let state = await progress(session, schema, t, snap);
    for (const up of state.upstream) await converge(up, snap);
    // Upstream writes happened after `snap`: wait for them through a fresh snapshot.
    const own = state.upstream.length > 0 ? snapshotOf(await watermarkToken(session)) : snap;
    let pause = 5;
    let current = own;
    state = await progress(session, schema, t, current);
    while (!state.covered) {
      if (Date.now() >= deadline) {
        throw new TrellisError(
          'timeout',
          `${target} did not converge within ${timeoutMs} ms (is it paused, or are no staging and drain workers running?)`,
        );
      }
      await sleep(pause, signal);
      pause = Math.min(50, pause * 2);
      // A correction writes its keys into the ledger after the token was taken: wait for
      // them through a snapshot taken after it is done.
      if (!state.settled) current = snapshotOf(await watermarkToken(session));
      state = await progress(session, schema, t, current);
    }
  };
  await converge(target, snapshotOf(token));
}
