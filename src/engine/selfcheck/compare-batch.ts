import type { Session } from '../db/session.js';
import { isRowError } from '../drain/row-errors.js';
import { enterTransformWork } from '../drain/work-settings.js';
import { quoteIdent } from '../identifiers.js';
import { sleep } from '../workers/sleep.js';
import {
  both,
  compareSql,
  excludedScope,
  heldChangedSql,
  keyListScope,
  pendingChangedSql,
  pendingStatsSql,
  routedSql,
  type Scope,
  snapshotLocksSql,
} from './compare-sql.js';
import { type CheckContext, CheckStopped, checkTime, type Key } from './context.js';
import { renderKey } from './render-key.js';
import type { CheckShape } from './shape.js';
import { comparable, readState, waitComparable, waitConverged } from './transform-state.js';
import type { SelfCheckFinding } from './types.js';

/**
 * One batch of keys compared (a chunk, or a sample's keys), its differences sorted from
 * lag in the same snapshot, and those pending compared again until they settle (ADR 0015).
 */

/**
 * Keys found changed-but-not-applied are compared again, each time once the transform has
 * applied what the last comparison saw pending, until none is pending, or SETTLE_ROUNDS
 * comparisons in a row left as many pending, or SETTLE_MS. A key still pending then keeps
 * being written: the drain re-derives it whole from a newer state each time, so no
 * divergence can last there; it is reported as unsettled, not as a finding (ADR 0015).
 */
const SETTLE_ROUNDS = 5;
const SETTLE_MS = 60_000;
/** More pending changes than this, and every suspect of a chunk counts as pending. */
const ROUTE_LIMIT = 200_000;
/**
 * How long a comparison's transaction waits, under WAL capture, for the slot to pass its
 * WAL position; past it, its differences are compared again later instead.
 */
const DECODE_WAIT_MS = 20_000;
/** Floats (an aggregate over floats depends on the order rows are summed in). */
const FLOAT_TOLERANCE = 1e-9;

/** A difference as the comparison returns it: the texts of its key and its values. */
interface Diff {
  side: 't' | 'd';
  k: Key;
  v: Array<string | null>;
}

/** A difference found for one key, before it is known whether lag explains it. */
interface Suspect {
  k: Key;
  finding: SelfCheckFinding;
}

/** What the check has found so far. */
export class Findings {
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
 * Compares one batch of keys and sorts what differs: findings (returned, and counted), and
 * keys to settle, which are compared again until nothing is pending for them.
 */
export async function compareBatch(
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
  if (first.wal && first.confirmed.length > 0) {
    // WAL capture: a snapshot can see a source change whose ledger row is not decoded yet.
    // Such changes are routed in the comparison's snapshot once decoded (decodedSince);
    // besides, nothing the first comparison found is a finding until a second comparison,
    // once the drain has applied what was pending, finds it again (ADR 0015).
    first = { ...first, confirmed: [], pending: [...first.pending, ...first.confirmed] };
  }
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
  /** The instance captures from the WAL (a ledger row can commit after its change). */
  wal: boolean;
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
  // Under WAL capture a comparison waits, inside its transaction, for the slot to decode
  // (decodedSince): holding the locks meanwhile could wait on a drain that waits on them
  // (its recompute's TRUNCATE) while the decoder waits on that drain. There, the locks are
  // not taken (a finding lag explains stays possible while a recompute runs).
  const [mode] = await session.query<{ wal: boolean }>(
    `SELECT c.wal_slot IS NOT NULL AS wal FROM ${quoteIdent(schema)}.config c`,
  );
  return session.transaction(async (): Promise<Sorted> => {
    // First, before the snapshot: see snapshotLocksSql.
    if (!mode?.wal) await session.query(snapshotLocksSql(schema, shape));
    const state = await readState(session, schema, shape.plan.id);
    const wal = mode?.wal ? await walPosition(ctx) : null;
    const viaWal = wal !== null;
    await enterTransformWork(session, schema, shape.plan, true);
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
    if (suspects.length === 0) {
      return { snapshot: state.snap, wal: viaWal, rows, confirmed: [], pending: [] };
    }

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
    const confirmed = suspects.filter((s) => !isPending(s));
    const pending = suspects.filter(isPending);
    if (wal === null || confirmed.length === 0) {
      return { snapshot: state.snap, wal: viaWal, rows, confirmed, pending };
    }
    // WAL capture (ADR 0023): a change committed before this snapshot may not have been
    // decoded into the ledger yet, so the snapshot could not see it pending. Another
    // session waits for the slot to pass this snapshot's WAL position and reads what was
    // decoded since; it is routed here, against this snapshot's sources and key map, as it
    // would have been had it been in the ledger (routed against newer data, a later change
    // can have moved a row off the route that explains the difference).
    const late = await decodedSince(ctx, shape, state.snap, wal.lsn);
    const lateKeys =
      late === 'all'
        ? 'all'
        : late.length === 0
          ? new Set<string>()
          : // The array itself: the client serialises a jsonb parameter as JSON (a string
            // given here was sent as a JSON string, a scalar: every such comparison failed
            // with 22023, taken for a failing row, and was tried again until its time ran out).
            await routed(session, shape, GIVEN_CHANGES_SQL, [late], confirmed);
    const isLate = (s: Suspect) => lateKeys === 'all' || lateKeys.has(routeKey(shape, s.k));
    return {
      snapshot: state.snap,
      wal: viaWal,
      rows,
      confirmed: confirmed.filter((s) => !isLate(s)),
      pending: [...pending, ...confirmed.filter(isLate)],
    };
  }, 'BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY');
}

/** Changes given as a parameter (`[[source_id, [key texts…]], …]`), in pendingChangedSql's shape. */
const GIVEN_CHANGES_SQL = `SELECT (e->>0)::int AS source_id,
       ARRAY(SELECT jsonb_array_elements_text(e->1)) AS key
  FROM jsonb_array_elements($1::jsonb) e`;

/**
 * The WAL insert position now, for an instance that captures from a replication slot
 * (the caller knows: under trigger capture every change is in the ledger at its commit).
 */
async function walPosition(ctx: CheckContext): Promise<{ lsn: string }> {
  const [row] = await ctx.session.query<{ lsn: string }>(
    'SELECT pg_current_wal_insert_lsn()::text AS lsn',
  );
  return { lsn: row!.lsn };
}

/**
 * On a session of its own, waits until the slot has acknowledged `lsn`, then returns the
 * changes that reached the ledger after `snapshot` ('all' for a TRUNCATE among them, too
 * many to route, or a slot that does not get there in DECODE_WAIT_MS: every suspect is
 * then compared again).
 */
async function decodedSince(
  ctx: CheckContext,
  shape: CheckShape,
  snapshot: string,
  lsn: string,
): Promise<Array<[number, string[]]> | 'all'> {
  const s = quoteIdent(ctx.schema);
  const session = await ctx.acquire();
  try {
    const until = Date.now() + DECODE_WAIT_MS;
    let delay = 10;
    for (;;) {
      checkTime(ctx);
      const [row] = await session.query<{ decoded: boolean }>(
        `SELECT ${s}._wal_decoded($1::pg_lsn) AS decoded`,
        [lsn],
      );
      if (row?.decoded) break;
      if (Date.now() >= until) return 'all';
      // An idle WAL can end at the position: a commit moves it on (as awaitConverged does).
      if (delay >= 200) await session.query('SELECT pg_current_xact_id()');
      await sleep(delay, ctx.signal);
      delay = Math.min(200, delay * 2);
    }
    const [now] = await session.query<{ snap: string }>(
      'SELECT pg_current_snapshot()::text AS snap',
    );
    const snaps = [snapshot, now!.snap];
    const [stats] = await session.query<{ keys: number; truncated: boolean }>(
      pendingStatsSql(ctx.schema, shape),
      snaps,
    );
    if (stats?.truncated || (stats?.keys ?? 0) > ROUTE_LIMIT) return 'all';
    if ((stats?.keys ?? 0) === 0) return [];
    const rows = await session.query<{ source_id: number; key: string[] }>(
      pendingChangedSql(ctx.schema, shape),
      snaps,
    );
    return rows.map((r) => [r.source_id, r.key]);
  } finally {
    await session.release();
  }
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
