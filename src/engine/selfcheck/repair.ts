import type { Session } from '../db/session.js';
import { mapGroup, mapKeys, regroupSql } from '../drain/aggregate-sql.js';
import { applyKeysBisecting, type ChangedKey } from '../drain/apply-keys.js';
import { changedFromList } from '../drain/changed-sql.js';
import { deltaRegroupSql } from '../drain/delta-sql.js';
import { loadPlan, type TransformPlan } from '../drain/plan.js';
import { rederiveSql } from '../drain/rederive-sql.js';
import { isRowError } from '../drain/row-errors.js';
import { shadowGroupRowsSql } from '../drain/shadow-sql.js';
import { col, list, restrictedWhere, tuple } from '../drain/sql-parts.js';
import { enterTransformWork } from '../drain/work-settings.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import type { CheckShape } from './shape.js';

type Key = Array<string | null>;

/**
 * Re-derives the target keys a self-check found diverged, through the drain's own path
 * (`applyKeysBisecting`: a key whose re-derivation fails is held, as the drain holds it),
 * in one transaction. It first takes the transform's page slots and pipeline row, as the
 * drain does to apply changes: a drain applying a newer change meanwhile would otherwise
 * be overwritten by this older snapshot's rows, and its change never applied again.
 *
 * - Projections and joins: the driving keys of the diverged rows.
 * - GROUP BY: the driving keys of the rows in the diverged groups, now and as the key map
 *   has them (every source's keys, for a key map that is a shadow); then the groups
 *   themselves, whole (a group the target holds and no row
 *   maps to is deleted that way).
 * - A grand total: the one row.
 *
 * Returns how many findings were repaired (all of them, when it commits).
 */
export async function repairFindings(
  session: Session,
  schema: string,
  checked: TransformPlan,
  shape: CheckShape,
  keys: Key[],
  log: Logger,
): Promise<number> {
  const s = quoteIdent(schema);
  await session.transaction(async () => {
    await session.query(
      `SELECT 1 FROM ${s}.page_slots WHERE transform_id = $1 ORDER BY bucket FOR UPDATE`,
      [checked.id],
    );
    await session.query(`SELECT 1 FROM ${s}.pipeline WHERE transform_id = $1 FOR UPDATE`, [
      checked.id,
    ]);
    // Keys may have been held or released since the check read the plan.
    const plan = await loadPlan(session, schema, checked.id);
    await enterTransformWork(session, schema, plan, true);
    const drivingId = plan.sources[0]!.sourceId!;
    if (shape.kind === 'driving') {
      const driving = new Map<string, string[]>();
      for (const k of keys) {
        const d = shape.drivingPositions.map((p) => k[p] ?? '');
        driving.set(JSON.stringify(d), d);
      }
      const changed: ChangedKey[] = [...driving.values()].map((k) => ({ s: drivingId, k }));
      await applyKeysBisecting(session, schema, plan, changed, log);
    } else if (shape.kind === 'groups') {
      const rows = await session.query<{ s?: number; k: string[] }>(groupRowsSql(plan, shape), [
        keys.filter((k) => !k.includes(null)),
        keys.filter((k) => k.includes(null)),
      ]);
      await applyKeysBisecting(
        session,
        schema,
        plan,
        rows.map((r) => ({ s: r.s ?? drivingId, k: r.k })),
        log,
      );
      // Kept by delta: the groups' states are folded again from their key-map rows.
      const regroup = plan.delta ? deltaRegroupSql(plan) : regroupSql(plan);
      await tolerateRowErrors(session, () => session.query(regroup, [keys]), log);
    } else {
      await tolerateRowErrors(
        session,
        () => session.query(rederiveSql(plan, changedFromList()), [[{ s: drivingId, k: [] }]]),
        log,
      );
    }
  });
  return keys.length;
}

/**
 * Runs `statement` in a savepoint; a row error (a key the drain holds) rolls it back and
 * is logged: the keys it explains are held, and the report counts them as such.
 */
async function tolerateRowErrors(
  session: Session,
  statement: () => Promise<unknown>,
  log: Logger,
): Promise<void> {
  await session.query('SAVEPOINT trellis_repair');
  try {
    await statement();
    await session.query('RELEASE SAVEPOINT trellis_repair');
  } catch (error) {
    await session.query('ROLLBACK TO SAVEPOINT trellis_repair');
    if (!isRowError(error)) throw error;
    log.warn({}, `self-check repair: re-deriving the groups failed on a row: ${String(error)}`);
  }
}

/**
 * The driving keys (as text[]) of the rows in the groups `$1` (keys without a NULL) and
 * `$2` (with one): those that are in them now, and those the key map puts there.
 */
function groupRowsSql(plan: TransformPlan, shape: CheckShape): string {
  const driving = plan.sources[0]!;
  const types = shape.key.map((k) => k.type);
  const typed = types.map((type, i) => `(e->>${i})::${type}`);
  const inGroups = (items: string[]) =>
    `(${tuple(items)} IN (SELECT ${list(typed)} FROM jsonb_array_elements($1::jsonb) e)
      OR EXISTS (SELECT 1 FROM jsonb_array_elements($2::jsonb) e
                  WHERE ${items.map((item, i) => `${item} IS NOT DISTINCT FROM ${typed[i]}`).join(' AND ')}))`;
  const now = `SELECT ARRAY[${list(driving.keyColumns.map((k) => `${col(driving.alias, k)}::text`))}] AS k
    FROM ${plan.fromSql}
   WHERE ${restrictedWhere(inGroups(plan.groups.map((g) => `(${g.expression})`)), plan.where)}`;
  // A shadow (ADR 0051): every source row in those groups, now and in the shadow.
  if (plan.mapKind === 'shadow') return shadowGroupRowsSql(plan, inGroups);
  if (!plan.mapSql) return now;
  return `${now}
  UNION
  SELECT ARRAY[${list(mapKeys(driving, 'm').map((k) => `${k}::text`))}]
    FROM ${plan.mapSql} m
   WHERE ${inGroups(plan.groups.map((_, i) => `m.${mapGroup(i + 1)}`))}`;
}
