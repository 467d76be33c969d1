import type { Session } from '../db/session.js';
import { groupsFillSql } from './aggregate-sql.js';
import { backfillChunkSql } from './backfill-sql.js';
import { deltaFillStatements } from './delta-sql.js';
import type { TransformPlan } from './plan.js';
import { keyMatch, q, upsert } from './sql-parts.js';

/**
 * The target computed whole into a scratch table (with the key map and group states, which
 * the build statements fill alongside, into their own tables: the caller has emptied them
 * or made them anew), then merged into the target as the drain writes it: rows the new
 * contents lack deleted, rows that differ or are new upserted, the rest not touched.
 * Returns the rows the target holds after.
 *
 * Every statement is MVCC-safe (no TRUNCATE): a reader whose snapshot came before this
 * transaction commits reads the target (and the key map, and the states) as they were, and
 * one after reads them as they are now, never empty or half of it (ADR 0076). A chain
 * reading the target sees keyed changes. Used by a followed source change (ADR 0047) and
 * by a rebuild of a target that has rows (backfill.ts).
 */
export async function rederiveWhole(session: Session, plan: TransformPlan): Promise<number> {
  const scratch = `pg_temp.${q('trellis#refill')}`;
  await session.query(`DROP TABLE IF EXISTS ${scratch}`);
  await session.query(
    `CREATE TEMP TABLE ${q('trellis#refill')} (LIKE ${plan.targetSql}) ON COMMIT DROP`,
  );
  const into: TransformPlan = { ...plan, targetSql: scratch };
  if (plan.delta) {
    for (const statement of deltaFillStatements(into)) await session.query(statement);
  } else if (plan.aggregates) {
    await session.query(groupsFillSql(into));
  } else {
    await session.query(backfillChunkSql(into), [null, null]);
  }
  const gone =
    plan.key.length === 0
      ? `NOT EXISTS (SELECT 1 FROM ${scratch})`
      : `NOT EXISTS (SELECT 1 FROM ${scratch} n WHERE ${keyMatch(plan, 'n', 't')})`;
  await session.query(`DELETE FROM ${plan.targetSql} t WHERE ${gone}`);
  await session.query(upsert(plan, scratch));
  const [row] = await session.query<{ n: string }>(`SELECT count(*) AS n FROM ${scratch}`);
  return Number(row?.n ?? 0);
}

/**
 * Empties the key map and group states of `plan` with DELETE, not TRUNCATE: a
 * repeatable-read snapshot taken before this transaction commits (a self-check's
 * comparison, ADR 0015) reads them as they were, and nothing waits for an ACCESS
 * EXCLUSIVE lock behind such a reader (ADR 0076).
 */
export async function emptyKeyState(session: Session, plan: TransformPlan): Promise<void> {
  if (plan.mapSql) await session.query(`DELETE FROM ${plan.mapSql}`);
  if (plan.delta) await session.query(`DELETE FROM ${plan.delta.statesSql}`);
}
