import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';
import { changedFromList } from './changed-sql.js';
import { loadPlan, type TransformPlan } from './plan.js';
import { affectedDrivingKeysSql, rederiveSql } from './rederive-sql.js';
import { isRowError } from './row-errors.js';
import { writtenColumns } from './sql-parts.js';
import { rederiveCounted, type Tally } from './tally.js';
import { keepsWrittenJoinOrder, withApplySettings } from './work-settings.js';

/** A changed source key as the ledger holds it: the source's id and the key as text. */
export interface ChangedKey {
  s: number;
  k: string[];
}

/** Held-key warnings logged one by one in a bisection; the rest go into one summary line. */
export const HELD_KEY_LOG_LINES = 10;

/**
 * One bisection's state, shared by its recursion (issue #21 item 12, ADR 0040): the keys
 * it held so far, by address; whether holding them paused the transform (the bisection
 * then stops: the keys it did not try wait for RESUME, which retries the range); and the
 * plan it applies, which loses a column once that column pauses (the rest of the keys
 * then go through without it, instead of each being held there).
 */
export interface Bisection {
  plan: TransformPlan;
  held: number;
  /** Keys held per address (`t`, `t.column`), for the summary. */
  byAddress: Map<string, number>;
  /** Warning lines logged for single keys (at most HELD_KEY_LOG_LINES). */
  logged: number;
  /** Addresses that paused themselves during this bisection. */
  paused: string[];
  /** The transform paused (its address reached quarantineThreshold): nothing more is tried. */
  stopped: boolean;
  /** Keys left untried when it stopped. */
  untried: number;
  /** Nested calls running (a joined row's key is bisected again as driving keys). */
  depth: number;
}

export function newBisection(plan: TransformPlan): Bisection {
  return {
    plan,
    held: 0,
    byAddress: new Map(),
    logged: 0,
    paused: [],
    stopped: false,
    untried: 0,
    depth: 0,
  };
}

/**
 * Re-derives `keys` in the current transaction, finding by bisection the keys whose
 * re-derivation fails with a row error: those are held back from this transform (and
 * only from it), at the narrowest address that explains the failure (`holdNarrowest`);
 * everything else is applied. Errors that no row explains propagate. Returns how many
 * keys were held; `run` (when given) says whether the transform paused meanwhile.
 *
 * Each held key counts at once toward its address's quarantineThreshold (_hold_key counts
 * this transaction's holds too): a column that pauses is left out of the rest of the keys,
 * and a transform that pauses stops the bisection there. Only the first
 * HELD_KEY_LOG_LINES held keys are logged one by one; one line then sums up the rest.
 */
export async function applyKeysBisecting(
  session: Session,
  schema: string,
  plan: TransformPlan,
  keys: ChangedKey[],
  log: Logger,
  tally?: Tally,
  run: Bisection = newBisection(plan),
): Promise<number> {
  const attempt = async (part: ChangedKey[]): Promise<number> => {
    if (part.length === 0) return 0;
    if (run.stopped) {
      run.untried += part.length;
      return 0;
    }
    const error = await tryRederive(session, run.plan, part, true, tally);
    if (error === null) return 0;
    if (part.length === 1) {
      return holdNarrowest(session, schema, run, part[0]!, error, log, tally);
    }
    const middle = part.length >> 1;
    return (await attempt(part.slice(0, middle))) + (await attempt(part.slice(middle)));
  };
  run.depth += 1;
  let held: number;
  try {
    held = await attempt(keys);
  } finally {
    run.depth -= 1;
  }
  // Summed up once, by the outermost call (an error rolls the holds back: nothing to say).
  if (run.depth === 0) summarize(run, log);
  return held;
}

/**
 * The one line that sums up a bisection whose held keys were not all logged, or that
 * paused. Said by the outermost applyKeysBisecting; a caller that bisects in slices with
 * one Bisection raises `depth` around them and says it once at the end.
 */
export function summarize(run: Bisection, log: Logger): void {
  if (run.held <= run.logged && run.paused.length === 0) return;
  const addresses = Object.fromEntries(run.byAddress);
  const counts = [...run.byAddress].map(([a, n]) => `${n} at ${a}`).join(', ');
  const paused =
    run.paused.length === 0
      ? ''
      : run.stopped
        ? `; ${run.paused.join(', ')} paused at quarantineThreshold, ${run.untried} keys left untried until RESUME`
        : `; ${run.paused.join(', ')} paused at quarantineThreshold (the other keys went on without it)`;
  log.warn(
    {
      target: run.plan.target,
      held: run.held,
      logged: run.logged,
      addresses,
      paused: run.paused,
      untried: run.untried,
    },
    `${run.held} keys held in one pass (${counts}), ${run.held - run.logged} of them not logged one by one${paused}: see quarantined()`,
  );
}

/**
 * Re-derives `keys` under `plan` in a savepoint: kept when it goes through (if `keep`,
 * counted in `tally`), rolled back otherwise. Returns null, or the row error it failed
 * with (any other error propagates).
 */
async function tryRederive(
  session: Session,
  plan: TransformPlan,
  keys: ChangedKey[],
  keep: boolean,
  tally?: Tally,
): Promise<unknown | null> {
  await session.query('SAVEPOINT trellis_keys');
  try {
    const counted = { keys: 0, upserted: 0, deleted: 0 };
    // Only the keys' sources (a shadow's statement then joins for those alone).
    const sources = new Set(keys.map((k) => k.s));
    await withApplySettings(session, keepsWrittenJoinOrder(plan, 'rederive'), () =>
      rederiveCounted(
        session,
        rederiveSql(plan, changedFromList(), null, 'rederive', sources),
        [keys],
        counted,
      ),
    );
    if (keep && tally) {
      tally.keys += counted.keys;
      tally.upserted += counted.upserted;
      tally.deleted += counted.deleted;
    }
    await session.query(
      keep ? 'RELEASE SAVEPOINT trellis_keys' : 'ROLLBACK TO SAVEPOINT trellis_keys',
    );
    if (!keep) await session.query('RELEASE SAVEPOINT trellis_keys');
    return null;
  } catch (error) {
    await session.query('ROLLBACK TO SAVEPOINT trellis_keys');
    await session.query('RELEASE SAVEPOINT trellis_keys');
    if (!isRowError(error)) throw error;
    return error;
  }
}

/** `plan` with `columns` left unwritten, as paused columns are (their rows keep their values). */
function without(plan: TransformPlan, columns: Iterable<string>): TransformPlan {
  const skip = new Set(columns);
  return {
    ...plan,
    columns: plan.columns.map((c) => (skip.has(c.name) ? { ...c, paused: true } : c)),
  };
}

/**
 * Holds one key whose re-derivation failed, at the narrowest address that explains it:
 * - a projection's or join's row whose other columns evaluate is held at the column(s)
 *   whose expression fails (`t.column`): the row is written with every other column now,
 *   and that column keeps its last value (NULL for a new row) until released;
 * - a failure no single column explains (WHERE, JOIN ON, a constraint on the target),
 *   and any failure of an aggregating transform (an aggregate mixes the rows of a
 *   group), holds the key for the whole transform (`t`): its changes are skipped.
 * A joined row's key is first turned into the driving keys of the rows it touches, each
 * attributed on its own. Returns how many keys were held.
 */
async function holdNarrowest(
  session: Session,
  schema: string,
  run: Bisection,
  key: ChangedKey,
  error: unknown,
  log: Logger,
  tally?: Tally,
): Promise<number> {
  const plan = run.plan;
  const driving = plan.sources[0]!;
  if (!plan.aggregates && key.s !== driving.sourceId) {
    const rows = await session.query<{ k: string[] }>(affectedDrivingKeysSql(plan), [[key]]);
    const keys = rows.map((r) => ({ s: driving.sourceId!, k: r.k }));
    if (keys.length > 0) return applyKeysBisecting(session, schema, plan, keys, log, tally, run);
  }
  if (!plan.aggregates && key.s === driving.sourceId) {
    const candidates = writtenColumns(plan)
      .filter((c) => !c.isKey)
      .map((c) => c.name);
    // The row without any of them: if that fails too, no column explains the failure.
    if (
      candidates.length > 0 &&
      (await tryRederive(session, without(plan, candidates), [key], false)) === null
    ) {
      const culprits = new Map<string, unknown>();
      for (const column of candidates) {
        const alone = without(
          plan,
          candidates.filter((c) => c !== column),
        );
        const failure = await tryRederive(session, alone, [key], false);
        if (failure !== null) culprits.set(column, failure);
      }
      if (
        culprits.size > 0 &&
        (await tryRederive(session, without(plan, culprits.keys()), [key], true, tally)) === null
      ) {
        for (const [column, failure] of culprits) {
          await hold(session, schema, run, key, column, failure, log);
        }
        return 1;
      }
    }
  }
  await hold(session, schema, run, key, '', error, log);
  return 1;
}

async function hold(
  session: Session,
  schema: string,
  run: Bisection,
  key: ChangedKey,
  column: string,
  error: unknown,
  log: Logger,
): Promise<void> {
  const plan = run.plan;
  const message = error instanceof Error ? error.message : String(error);
  const sqlstate = sqlstateOf(error) ?? null;
  const [row] = await session.query<{ paused: boolean }>(
    `SELECT ${quoteIdent(schema)}._hold_key($1, $2, $3::text[], $4, $5, $6) AS paused`,
    [plan.id, key.s, key.k, column, message, sqlstate],
  );
  const address = column ? `${plan.target}.${column}` : plan.target;
  run.held += 1;
  run.byAddress.set(address, (run.byAddress.get(address) ?? 0) + 1);
  if (row?.paused) {
    run.paused.push(address);
    // The transform stops here; a paused column is left out of the rest of the keys.
    if (column === '') run.stopped = true;
    else run.plan = await loadPlan(session, schema, plan.id);
    // The pause itself is logged once, as a state change, by the catalog watch.
    log.debug({ target: plan.target, address }, `${address} paused: it holds too many keys`);
  }
  if (run.logged >= HELD_KEY_LOG_LINES) return;
  run.logged += 1;
  log.warn(
    {
      target: plan.target,
      address,
      source_id: key.s,
      key: renderKey(key.k),
      sqlstate,
      error: message,
    },
    `key held at ${address}: re-deriving it failed: ${message}`,
  );
}

/** A key as Trellis renders it everywhere (as `<schema>.render_key` in SQL does). */
export function renderKey(key: string[]): string {
  if (key.length === 1) return key[0]!;
  const element = (v: string) =>
    v === '' || /[{},"\\\s]/.test(v) || v.toUpperCase() === 'NULL'
      ? `"${v.replace(/[\\"]/g, '\\$&')}"`
      : v;
  return `{${key.map(element).join(',')}}`;
}
