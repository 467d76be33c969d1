import type { DrainFailure } from '../catalog/status-types.js';
import type { Session } from '../db/session.js';
import { loadPlan } from '../drain/plan.js';
import { isRowError } from '../drain/row-errors.js';
import { enterTransformWork } from '../drain/work-settings.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sleep } from '../workers/sleep.js';
import {
  both,
  chunkBoundarySql,
  compareSql,
  excludedScope,
  heldChangedSql,
  keyListScope,
  nullGroupsScope,
  pendingChangedSql,
  pendingStatsSql,
  rangeScope,
  routedSql,
  type Scope,
  WHOLE,
} from './compare-sql.js';
import { renderKey } from './render-key.js';
import { repairFindings } from './repair.js';
import { sampleKeys } from './sample.js';
import { type CheckShape, loadShape } from './shape.js';
import type { SelfCheckFinding, SelfCheckMode, SelfCheckReport } from './types.js';

/** Keys compared per statement (one snapshot each, never held for long). */
export const CHUNK_KEYS = 50_000;
/**
 * Keys found changed-but-not-applied are compared again, each time once the transform has
 * applied what the last comparison saw pending, until none is pending, or SETTLE_ROUNDS
 * comparisons in a row left as many pending, or SETTLE_MS. A key still pending then keeps
 * being written: the drain re-derives it whole from a newer state each time, so no
 * divergence can last there; it is reported as unsettled, not as a finding (ADR 0015).
 */
const SETTLE_ROUNDS = 5;
const SETTLE_MS = 60_000;
/** How long a check waits for its transform to be built (live or catching up). */
const COMPARABLE_WAIT_MS = 600_000;
/** More pending changes than this, and every suspect of a chunk counts as pending. */
const ROUTE_LIMIT = 200_000;
/** Floats (an aggregate over floats depends on the order rows are summed in). */
const FLOAT_TOLERANCE = 1e-9;

/** A check that cannot go on: `cancelled` (paused, rebuilt), `failed`, or `gone` (dropped). */
export class CheckStopped extends Error {
  constructor(
    readonly state: 'cancelled' | 'failed' | 'gone',
    message: string,
  ) {
    super(message);
  }
}

export interface CheckContext {
  session: Session;
  schema: string;
  log: Logger;
  signal: AbortSignal;
  /** When the check must have finished (ms since the epoch). */
  deadline: number;
  /** Records progress; `total` once known. */
  progress(rowsCompared: number, total?: number): Promise<void>;
}

export interface CheckRequest {
  transformId: number;
  mode: SelfCheckMode;
  sample: number;
  maxFindings: number;
  repair: boolean;
}

type Key = Array<string | null>;

/** A difference as the comparison returns it: the texts of its key and its values. */
interface Diff {
  side: 't' | 'd';
  k: Key;
  v: Array<string | null>;
}

interface State {
  target: string;
  phase: string;
  has_held: boolean;
  paused: boolean;
  pause_reason: string | null;
  settled: boolean;
  cursor_snap: string | null;
  snap: string;
}

/** A difference found for one key, before it is known whether lag explains it. */
interface Suspect {
  k: Key;
  finding: SelfCheckFinding;
}

/** What the check has found so far. */
class Findings {
  readonly listed: SelfCheckFinding[] = [];
  readonly counts = { missing: 0, extra: 0, differs: 0 };
  unsettled = 0;
  repaired = 0;
  rowsCompared = 0;
  constructor(private readonly max: number) {}

  add(finding: SelfCheckFinding): void {
    this.counts[finding.kind] += 1;
    if (this.listed.length < this.max) this.listed.push(finding);
  }

  get total(): number {
    return this.counts.missing + this.counts.extra + this.counts.differs;
  }
}

/**
 * Compares a transform's target with its definition recomputed from the sources (ADR
 * 0015), in chunks of keys, each in one short snapshot. A chunk's differences are sorted
 * in that same snapshot: a key some change not yet applied (or a key held in quarantine)
 * routes to, as the drain routes changes, is not a finding yet; every other difference
 * is, since the target must equal its definition wherever nothing is pending. Keys with
 * changes pending are compared again, each time in a new snapshot, until nothing is
 * pending for them; those still changing after SETTLE_MS are counted as unsettled.
 */
export async function runCheck(ctx: CheckContext, request: CheckRequest): Promise<SelfCheckReport> {
  const { session, schema } = ctx;
  await waitComparable(ctx, request.transformId);
  const plan = await loadPlan(session, schema, request.transformId);
  const shape = await loadShape(session, plan);
  const found = new Findings(request.maxFindings);

  const batch = async (scope: Scope, params: unknown[]) => {
    const confirmed = await compareBatch(ctx, shape, scope, params, found);
    if (request.repair && confirmed.length > 0) {
      found.repaired += await repairFindings(session, schema, plan, shape, confirmed, ctx.log);
    }
    await ctx.progress(found.rowsCompared);
  };

  if (request.mode === 'sample') {
    const keys = await sampleKeys(session, schema, shape, request.sample);
    await ctx.progress(0, keys.count);
    for (const part of keys.batches(CHUNK_KEYS)) await batch(keyListScope(shape), part);
  } else if (shape.kind === 'total') {
    await ctx.progress(0, 1);
    await batch(WHOLE, []);
  } else {
    await ctx.progress(0, await estimateRows(session, shape));
    const boundary = chunkBoundarySql(shape);
    let lo: string[] | null = null;
    for (;;) {
      checkTime(ctx);
      const rows: Array<{ upto: string[] }> = await session.query(boundary, [lo, CHUNK_KEYS]);
      const hi: string[] | null = rows[0]?.upto ?? null;
      await batch(rangeScope(shape), [lo, hi]);
      if (hi === null) break;
      lo = hi;
    }
    if (shape.kind === 'groups' && shape.key.some((k) => k.nullable)) {
      await batch(nullGroupsScope(shape), []);
    }
  }

  const tail = await readTail(session, schema, request.transformId);
  return {
    outcome: found.total > 0 ? 'diverged' : 'consistent',
    divergences: found.listed,
    counts: found.counts,
    rowsCompared: found.rowsCompared,
    truncated: found.total > found.listed.length,
    heldKeys: tail.heldKeys,
    unsettledKeys: found.unsettled,
    skippedColumns: shape.skipped,
    drainFailures: tail.drainFailures,
    repaired: request.repair ? { findings: found.repaired } : null,
  };
}

function checkTime(ctx: CheckContext): void {
  if (ctx.signal.aborted) throw new CheckStopped('failed', 'the handle shut down');
  if (Date.now() > ctx.deadline) {
    throw new CheckStopped(
      'failed',
      'the check ran out of time (a job may run for about an hour): check a sample instead',
    );
  }
}

async function readState(session: Session, schema: string, transformId: number): Promise<State> {
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

function comparable(state: State): boolean {
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
async function waitConverged(
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
async function waitComparable(ctx: CheckContext, transformId: number): Promise<void> {
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

async function estimateRows(session: Session, shape: CheckShape): Promise<number> {
  const [row] = await session.query<{ n: number }>(
    `SELECT CASE WHEN c.reltuples > 0 THEN c.reltuples::float8
                 ELSE (SELECT count(*) FROM ${shape.plan.targetSql})::float8 END AS n
       FROM pg_class c WHERE c.oid = $1::regclass`,
    [shape.plan.targetSql],
  );
  return Math.round(row?.n ?? 0);
}

/**
 * Compares one batch of keys and sorts what differs: findings (returned, and counted), and
 * keys to settle, which are compared again until nothing is pending for them.
 */
async function compareBatch(
  ctx: CheckContext,
  shape: CheckShape,
  scope: Scope,
  params: unknown[],
  found: Findings,
): Promise<Key[]> {
  // A rebuild (requestBackfill, RESUME) empties the target: wait for it, as at the start.
  await waitComparable(ctx, shape.plan.id);
  const until = Math.min(ctx.deadline, Date.now() + SETTLE_MS);
  let delay = 25;
  const pause = async () => {
    await sleep(delay, ctx.signal);
    delay = Math.min(1_000, delay * 2);
    checkTime(ctx);
  };
  let first: Sorted | undefined;
  while (!first) {
    try {
      first = await compareInSnapshot(ctx, shape, scope, params, null);
    } catch (error) {
      // A row whose recomputation fails and that no held key explains yet: its change is
      // on its way to the drain, which will hold it. Wait for that, not for ever.
      if (!isRowError(error)) throw error;
      if (Date.now() >= until) {
        throw new CheckStopped(
          'failed',
          `recomputing ${shape.plan.target} fails for rows that no key held in quarantine explains: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
      await pause();
    }
  }
  found.rowsCompared += first.rows;
  const confirmed: Key[] = [];
  const take = (sorted: Sorted) => {
    for (const s of sorted.confirmed) {
      found.add(s.finding);
      confirmed.push(s.k);
    }
  };
  take(first);
  let pending = first.pending;
  let seen = first.snapshot;
  let stale = 0;
  while (pending.length > 0 && stale < SETTLE_ROUNDS && Date.now() < until && !ctx.signal.aborted) {
    // Compare them again once the transform has applied what that comparison saw pending.
    await waitConverged(ctx, shape.plan.id, seen, until);
    try {
      const again = await compareInSnapshot(
        ctx,
        shape,
        keyListScope(shape),
        keyListParams(
          shape,
          pending.map((p) => p.k),
        ),
        new Set(pending.map((p) => JSON.stringify(p.k))),
      );
      take(again);
      stale = again.pending.length < pending.length ? 0 : stale + 1;
      pending = again.pending;
      seen = again.snapshot;
    } catch (error) {
      if (!isRowError(error)) throw error;
    }
  }
  checkTime(ctx);
  found.unsettled += pending.length;
  return confirmed;
}

interface Sorted {
  /** The comparison's snapshot. */
  snapshot: string;
  rows: number;
  confirmed: Suspect[];
  pending: Suspect[];
}

/**
 * One comparison in one snapshot (repeatable read), and for each difference, in the same
 * snapshot, whether a change not yet applied explains it. Rows that keys held in
 * quarantine route to are left out: their recomputation fails, or their changes are
 * skipped, until the keys are released (the report gives the held keys). `only`: the keys
 * to consider (a re-check), or null for all.
 */
async function compareInSnapshot(
  ctx: CheckContext,
  shape: CheckShape,
  scope: Scope,
  params: unknown[],
  only: Set<string> | null,
): Promise<Sorted> {
  const { session, schema } = ctx;
  return session.transaction(async () => {
    const state = await readState(session, schema, shape.plan.id);
    await enterTransformWork(session, schema, shape.plan);
    let scoped = scope;
    let all = params;
    if (state.has_held) {
      const held = await session.query<{ k: Key }>(
        routedSql(shape, heldChangedSql(schema, shape), null),
      );
      if (held.length > 0) {
        scoped = both(scope, excludedScope(shape, params.length + 1));
        all = [...params, held.map((r) => r.k)];
      }
    }
    const [row] = await session.query<{ t_rows: number; diffs: Diff[] }>(
      compareSql(shape, scoped),
      all,
    );
    const diffs = row?.diffs ?? [];
    const suspects = suspectsOf(shape, diffs).filter(
      (s) => only === null || only.has(JSON.stringify(s.k)),
    );
    const dOnly = suspects.filter((s) => s.finding.kind === 'missing').length;
    const rows = (row?.t_rows ?? 0) + dOnly;
    if (suspects.length === 0) return { snapshot: state.snap, rows, confirmed: [], pending: [] };

    let pendingKeys: Set<string> | 'all' = 'all';
    if (comparable(state)) {
      const snaps = [state.cursor_snap, state.snap];
      const [stats] = await session.query<{ keys: number; truncated: boolean }>(
        pendingStatsSql(schema, shape),
        snaps,
      );
      if (!stats?.truncated && (stats?.keys ?? 0) <= ROUTE_LIMIT) {
        pendingKeys =
          (stats?.keys ?? 0) === 0
            ? new Set()
            : await routed(session, shape, pendingChangedSql(schema, shape), snaps, suspects);
      }
    }
    const isPending = (s: Suspect) =>
      pendingKeys === 'all' || pendingKeys.has(routeKey(shape, s.k));
    return {
      snapshot: state.snap,
      rows,
      confirmed: suspects.filter((s) => !isPending(s)),
      pending: suspects.filter(isPending),
    };
  }, 'BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY');
}

/** The differences by key: missing, extra, or differs (floats within the tolerance are equal). */
function suspectsOf(shape: CheckShape, diffs: Diff[]): Suspect[] {
  const byKey = new Map<string, { t?: Diff; d?: Diff }>();
  for (const diff of diffs) {
    const id = JSON.stringify(diff.k);
    const entry = byKey.get(id) ?? {};
    entry[diff.side] = diff;
    byKey.set(id, entry);
  }
  const suspects: Suspect[] = [];
  for (const { t, d } of byKey.values()) {
    if (t && d) {
      const columns = shape.compared.flatMap((c, i) => {
        const target = t.v[i] ?? null;
        const recomputed = d.v[i] ?? null;
        if (target === recomputed) return [];
        if (c.float && target !== null && recomputed !== null && floatsClose(target, recomputed)) {
          return [];
        }
        return [{ column: c.name, target, recomputed }];
      });
      if (columns.length > 0) {
        suspects.push({ k: t.k, finding: { kind: 'differs', key: renderKey(t.k), columns } });
      }
    } else if (t) {
      suspects.push({ k: t.k, finding: { kind: 'extra', key: renderKey(t.k) } });
    } else if (d) {
      suspects.push({ k: d.k, finding: { kind: 'missing', key: renderKey(d.k) } });
    }
  }
  return suspects;
}

function floatsClose(a: string, b: string): boolean {
  const x = Number(a);
  const y = Number(b);
  if (!Number.isFinite(x) || !Number.isFinite(y)) return a === b;
  return Math.abs(x - y) <= FLOAT_TOLERANCE * Math.max(Math.abs(x), Math.abs(y), 1e-300);
}

/** What routing yields for a target key: its driving key for a `driving` shape, else itself. */
function routeKey(shape: CheckShape, k: Key): string {
  return JSON.stringify(shape.kind === 'driving' ? shape.drivingPositions.map((p) => k[p]) : k);
}

/** The parameters of a key-list scope for `keys` (target keys). */
export function keyListParams(shape: CheckShape, keys: Key[]): unknown[] {
  if (shape.kind === 'driving') {
    const driving = new Map<string, Key>();
    for (const k of keys) {
      const d = shape.drivingPositions.map((p) => k[p] ?? null);
      driving.set(JSON.stringify(d), d);
    }
    return [[...driving.values()]];
  }
  if (shape.kind === 'total') return [];
  return [keys.filter((k) => !k.includes(null)), keys.filter((k) => k.includes(null))];
}

/** Which suspects the changes `changedSql` (with `params`) route to, by routeKey. */
async function routed(
  session: Session,
  shape: CheckShape,
  changedSql: string,
  params: unknown[],
  suspects: Suspect[],
): Promise<Set<string>> {
  const suspectParams = keyListParams(
    shape,
    suspects.map((s) => s.k),
  );
  const rows = await session.query<{ k: Key }>(routedSql(shape, changedSql, params.length + 1), [
    ...params,
    ...suspectParams,
  ]);
  if (shape.kind === 'total') {
    return new Set(rows.length > 0 ? suspects.map((s) => routeKey(shape, s.k)) : []);
  }
  return new Set(rows.map((r) => JSON.stringify(r.k)));
}

/** The transform's held keys and open drain failures, as the check ends. */
async function readTail(
  session: Session,
  schema: string,
  transformId: number,
): Promise<{ heldKeys: SelfCheckReport['heldKeys']; drainFailures: DrainFailure[] }> {
  const s = quoteIdent(schema);
  const [row] = await session.query<{
    held: number;
    oldest: Date | null;
    failures: Array<{
      seg: string;
      tables: string[];
      error: string;
      sqlstate: string | null;
      since: string;
      last_seen: string;
      attempts: number;
    }>;
  }>(
    `SELECT (SELECT count(*) FROM ${s}.held_keys h WHERE h.transform_id = $1)::int AS held,
            (SELECT min(held_at) FROM ${s}.held_keys h WHERE h.transform_id = $1) AS oldest,
            coalesce((
              SELECT json_agg(json_build_object(
                       'seg', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
                       'sqlstate', pg.sqlstate, 'since', pg.first_failed_at,
                       'last_seen', pg.last_failed_at,
                       'tables', ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                         FROM ${s}.transform_sources ts
                                        WHERE ts.transform_id = $1 ORDER BY ts.ordinal))
                     ORDER BY pg.page)
                FROM ${s}.pages pg JOIN ${s}.pipeline p ON p.transform_id = pg.transform_id
               WHERE pg.transform_id = $1 AND pg.attempts > 0), '[]') AS failures`,
    [transformId],
  );
  return {
    heldKeys: { count: row?.held ?? 0, oldestPoisonedAt: row?.oldest ?? null },
    drainFailures: (row?.failures ?? []).map((f) => ({
      segSeq: Number(f.seg),
      tables: f.tables,
      error: f.error,
      sqlstate: f.sqlstate,
      since: new Date(f.since),
      lastSeen: new Date(f.last_seen),
      attempts: f.attempts,
    })),
  };
}
