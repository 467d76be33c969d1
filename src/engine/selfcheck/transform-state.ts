import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import { sleep } from '../workers/sleep.js';
import { type CheckContext, CheckStopped, checkTime } from './context.js';

/** Where the checked transform is: whether its target can be compared with its definition now. */

/** How long a check waits for its transform to be built (live or catching up). */
const COMPARABLE_WAIT_MS = 600_000;

export interface State {
  target: string;
  phase: string;
  has_held: boolean;
  paused: boolean;
  pause_reason: string | null;
  settled: boolean;
  cursor_snap: string | null;
  snap: string;
}

export async function readState(
  session: Session,
  schema: string,
  transformId: number,
): Promise<State> {
  const s = quoteIdent(schema);
  const [state] = await session.query<State>(
    `SELECT t.target_name AS target, p.phase, t.paused_at IS NOT NULL AS paused, t.pause_reason,
            EXISTS (SELECT 1 FROM ${s}.held_keys h WHERE h.transform_id = t.id) AS has_held,
            ${s}._sources_settled(t.id) AS settled, k.snap::text AS cursor_snap,
            pg_current_snapshot()::text AS snap
       FROM ${s}.transforms t
       JOIN ${s}.pipeline p ON p.transform_id = t.id
       LEFT JOIN ${s}.ticks k ON k.seq = p.cursor_tick
      WHERE t.id = $1`,
    [transformId],
  );
  if (!state) throw new CheckStopped('gone', 'the transform was dropped');
  if (state.paused) {
    throw new CheckStopped(
      'cancelled',
      `${state.target} was paused (${state.pause_reason ?? 'operator'}): a paused target is left as it is; RESUME it and check again`,
    );
  }
  return state;
}

export function comparable(state: State): boolean {
  return (
    (state.phase === 'live' || state.phase === 'catching_up') &&
    state.settled &&
    state.cursor_snap !== null
  );
}

/**
 * Waits (until `until` at most) for the transform to reflect every change `snapshot`
 * sees (`<schema>._converged`, as awaitConverged asks), checking every few milliseconds.
 */
export async function waitConverged(
  ctx: CheckContext,
  transformId: number,
  snapshot: string,
  until: number,
): Promise<void> {
  let delay = 10;
  while (Date.now() < until && !ctx.signal.aborted) {
    const [row] = await ctx.session.query<{ converged: boolean }>(
      `SELECT ${quoteIdent(ctx.schema)}._converged($1, $2::pg_snapshot) AS converged`,
      [transformId, snapshot],
    );
    if (row?.converged) return;
    await sleep(delay, ctx.signal);
    delay = Math.min(200, delay * 2);
  }
}

/** Waits until the transform is built (its backfill done) and its sources settled. */
export async function waitComparable(ctx: CheckContext, transformId: number): Promise<void> {
  const until = Math.min(ctx.deadline, Date.now() + COMPARABLE_WAIT_MS);
  for (;;) {
    checkTime(ctx);
    const state = await readState(ctx.session, ctx.schema, transformId);
    if (comparable(state)) return;
    if (Date.now() > until) {
      throw new CheckStopped(
        'failed',
        `${state.target} did not finish building within ${COMPARABLE_WAIT_MS / 60_000} minutes (it is ${state.phase})`,
      );
    }
    await sleep(500, ctx.signal);
  }
}
