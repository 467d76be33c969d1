import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { sqlstateOf } from '../sqlstate.js';
import { changedFromList } from './changed-sql.js';
import type { TransformPlan } from './plan.js';
import { rederiveSql } from './rederive-sql.js';
import { isRowError } from './row-errors.js';

/** A changed source key as the ledger holds it: the source's id and the key as text. */
export interface ChangedKey {
  s: number;
  k: string[];
}

/**
 * Re-derives `keys` in the current transaction, finding by bisection the keys whose
 * re-derivation fails with a row error: those are held back from this transform (and
 * only from it), everything else is applied. Errors that no row explains propagate.
 * Returns how many keys were held.
 */
export async function applyKeysBisecting(
  session: Session,
  schema: string,
  plan: TransformPlan,
  keys: ChangedKey[],
  log: Logger,
): Promise<number> {
  const sql = rederiveSql(plan, changedFromList());
  const attempt = async (part: ChangedKey[]): Promise<number> => {
    if (part.length === 0) return 0;
    await session.query('SAVEPOINT trellis_keys');
    try {
      await session.query(sql, [part]);
      await session.query('RELEASE SAVEPOINT trellis_keys');
      return 0;
    } catch (error) {
      await session.query('ROLLBACK TO SAVEPOINT trellis_keys');
      await session.query('RELEASE SAVEPOINT trellis_keys');
      if (!isRowError(error)) throw error;
      if (part.length === 1) {
        await holdKey(session, schema, plan, part[0]!, error, log);
        return 1;
      }
      const middle = part.length >> 1;
      return (await attempt(part.slice(0, middle))) + (await attempt(part.slice(middle)));
    }
  };
  return attempt(keys);
}

async function holdKey(
  session: Session,
  schema: string,
  plan: TransformPlan,
  key: ChangedKey,
  error: unknown,
  log: Logger,
): Promise<void> {
  const message = error instanceof Error ? error.message : String(error);
  const sqlstate = sqlstateOf(error) ?? null;
  await session.query(
    `INSERT INTO ${quoteIdent(schema)}.held_keys (transform_id, source_id, key, error, sqlstate)
     VALUES ($1, $2, $3::text[], $4, $5)
     ON CONFLICT (transform_id, source_id, key)
       DO UPDATE SET error = EXCLUDED.error, sqlstate = EXCLUDED.sqlstate, held_at = now()`,
    [plan.id, key.s, key.k, message, sqlstate],
  );
  log.warn(
    { target: plan.target, source_id: key.s, key: key.k, sqlstate },
    `key held: re-deriving it failed: ${message}`,
  );
}
