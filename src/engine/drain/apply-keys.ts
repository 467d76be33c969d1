import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';
import { changedFromList } from './changed-sql.js';
import type { TransformPlan } from './plan.js';
import { affectedDrivingKeysSql, rederiveSql } from './rederive-sql.js';
import { isRowError } from './row-errors.js';
import { writtenColumns } from './sql-parts.js';
import { rederiveCounted, type Tally } from './tally.js';

/** A changed source key as the ledger holds it: the source's id and the key as text. */
export interface ChangedKey {
  s: number;
  k: string[];
}

/**
 * Re-derives `keys` in the current transaction, finding by bisection the keys whose
 * re-derivation fails with a row error: those are held back from this transform (and
 * only from it), at the narrowest address that explains the failure (`holdNarrowest`);
 * everything else is applied. Errors that no row explains propagate. Returns how many
 * keys were held.
 */
export async function applyKeysBisecting(
  session: Session,
  schema: string,
  plan: TransformPlan,
  keys: ChangedKey[],
  log: Logger,
  tally?: Tally,
): Promise<number> {
  const attempt = async (part: ChangedKey[]): Promise<number> => {
    if (part.length === 0) return 0;
    const error = await tryRederive(session, plan, part, true, tally);
    if (error === null) return 0;
    if (part.length === 1) {
      return holdNarrowest(session, schema, plan, part[0]!, error, log, tally);
    }
    const middle = part.length >> 1;
    return (await attempt(part.slice(0, middle))) + (await attempt(part.slice(middle)));
  };
  return attempt(keys);
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
    await rederiveCounted(session, rederiveSql(plan, changedFromList()), [keys], counted);
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
  plan: TransformPlan,
  key: ChangedKey,
  error: unknown,
  log: Logger,
  tally?: Tally,
): Promise<number> {
  const driving = plan.sources[0]!;
  if (!plan.aggregates && key.s !== driving.sourceId) {
    const rows = await session.query<{ k: string[] }>(affectedDrivingKeysSql(plan), [[key]]);
    const keys = rows.map((r) => ({ s: driving.sourceId!, k: r.k }));
    if (keys.length > 0) return applyKeysBisecting(session, schema, plan, keys, log, tally);
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
          await hold(session, schema, plan, key, column, failure, log);
        }
        return 1;
      }
    }
  }
  await hold(session, schema, plan, key, '', error, log);
  return 1;
}

async function hold(
  session: Session,
  schema: string,
  plan: TransformPlan,
  key: ChangedKey,
  column: string,
  error: unknown,
  log: Logger,
): Promise<void> {
  const message = error instanceof Error ? error.message : String(error);
  const sqlstate = sqlstateOf(error) ?? null;
  const [row] = await session.query<{ paused: boolean }>(
    `SELECT ${quoteIdent(schema)}._hold_key($1, $2, $3::text[], $4, $5, $6) AS paused`,
    [plan.id, key.s, key.k, column, message, sqlstate],
  );
  const address = column ? `${plan.target}.${column}` : plan.target;
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
  if (row?.paused) {
    // The pause itself is logged once, as a state change, by the catalog watch.
    log.debug({ target: plan.target, address }, `${address} paused: it holds too many keys`);
  }
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
