import type { Session } from '../db/session.js';
import type { PlanSource, TransformPlan } from '../drain/plan.js';

/**
 * What a self-check compares of one transform, and how it splits the key space. A target
 * row is identified by its key; the check compares every other column that is not paused
 * (a paused column keeps its values by design).
 *
 * - `driving` (projections, filters, joins): every target row holds its driving row's key
 *   (the FROM table's), so the key space splits by ranges of that key, on both sides.
 * - `groups` (GROUP BY): by ranges of the group key, read off the target; groups with a
 *   NULL in their key are compared apart (a row comparison with NULL decides nothing).
 * - `total` (aggregates without GROUP BY): one row, compared whole.
 */
export interface CheckShape {
  plan: TransformPlan;
  kind: 'driving' | 'groups' | 'total';
  /** The target's key columns, in key order. */
  key: Array<{ name: string; type: string; nullable: boolean }>;
  /** Non-key columns compared, with their expressions. */
  compared: Array<{ name: string; expression: string; float: boolean }>;
  /** Paused columns, left out. */
  skipped: string[];
  /** For `driving`: the driving source, and which key positions hold its key. */
  driving: PlanSource;
  /** For `driving`: the positions in `key` of the driving key's columns, in its key order. */
  drivingPositions: number[];
}

/** Reads the target's column types and builds the shape of a transform's check. */
export async function loadShape(session: Session, plan: TransformPlan): Promise<CheckShape> {
  const columns = await session.query<{
    name: string;
    type: string;
    typname: string;
    notnull: boolean;
  }>(
    `SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, t.typname,
            a.attnotnull AS notnull
       FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
      WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`,
    [plan.targetSql],
  );
  const byName = new Map(columns.map((c) => [c.name, c]));
  const key = plan.key.map((name) => {
    const c = byName.get(name);
    return { name, type: c?.type ?? 'text', nullable: !(c?.notnull ?? false) };
  });
  const keyNames = new Set(plan.key);
  const compared = plan.columns
    .filter((c) => !keyNames.has(c.name) && !c.paused)
    .map((c) => {
      const typname = byName.get(c.name)?.typname;
      return {
        name: c.name,
        expression: c.expression,
        float: typname === 'float4' || typname === 'float8',
      };
    });
  const skipped = plan.columns.filter((c) => c.paused && !keyNames.has(c.name)).map((c) => c.name);
  const driving = plan.sources[0]!;
  const kind = plan.aggregates ? (plan.groups.length > 0 ? 'groups' : 'total') : 'driving';
  const drivingPositions =
    kind === 'driving' ? (driving.targetKeyColumns ?? []).map((c) => plan.key.indexOf(c)) : [];
  return { plan, kind, key, compared, skipped, driving, drivingPositions };
}
