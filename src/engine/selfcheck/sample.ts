import type { Session } from '../db/session.js';
import { col, list, q, restrictedWhere, tuple } from '../drain/sql-parts.js';
import { enterTransformWork } from '../drain/work-settings.js';
import type { CheckShape } from './shape.js';

type Key = Array<string | null>;

/** The keys a sample check compares, and the key-list scope parameters for them in batches. */
export interface SampledKeys {
  count: number;
  batches(size: number): Iterable<unknown[]>;
}

/**
 * A sample across the key space: half the keys from the target (an `extra` row can only
 * be found there), half from the sources (a `missing` one only there), each drawn at
 * random (`TABLESAMPLE BERNOULLI`, sized from the planner's row estimate, then `random()`
 * order). For a projection or join the keys are driving keys (every target row of a
 * sampled driving row is compared); for a GROUP BY they are groups, those of sampled
 * source rows and sampled target rows. A grand total is its one row.
 */
export async function sampleKeys(
  session: Session,
  schema: string,
  shape: CheckShape,
  size: number,
): Promise<SampledKeys> {
  if (shape.kind === 'total') return { count: 1, batches: () => [[]] };
  const plan = shape.plan;
  const driving = shape.driving;
  const fromSources = Math.ceil(size / 2);
  const fromTarget = size - fromSources;
  const keys = await session.transaction(async () => {
    await enterTransformWork(session, schema, plan);
    const [estimates] = await session.query<{ source: number; target: number }>(
      `SELECT (SELECT reltuples::float8 FROM pg_class WHERE oid = $1::regclass) AS source,
              (SELECT reltuples::float8 FROM pg_class WHERE oid = $2::regclass) AS target`,
      [driving.table, plan.targetSql],
    );
    const percent = (n: number, rows: number | undefined) =>
      rows === undefined || rows <= 0 ? 100 : Math.min(100, Math.max(0.0001, (300 * n) / rows));
    const sampled = (table: string, columns: string[], percentParam: string, limitParam: string) =>
      `SELECT ${list(columns)} FROM ${table} TABLESAMPLE BERNOULLI (${percentParam}::float4)
        ORDER BY random() LIMIT ${limitParam}::int`;
    const params = [
      percent(fromSources, estimates?.source),
      fromSources,
      percent(fromTarget, estimates?.target),
      fromTarget,
    ];
    const drivingKeys = driving.keyColumns.map((k) => `s.${q(k)}`);
    let sql: string;
    if (shape.kind === 'driving') {
      const targetKeys = driving.targetKeyColumns!.map((c) => `t.${q(c)}`);
      sql = `SELECT ARRAY[${list(drivingKeys.map((k) => `${k}::text`))}] AS k
               FROM (${sampled(`${driving.table} s`, drivingKeys, '$1', '$2')}) s
             UNION
             SELECT ARRAY[${list(targetKeys.map((k) => `${k}::text`))}]
               FROM (${sampled(`${plan.targetSql} t`, targetKeys, '$3', '$4')}) t`;
    } else {
      const targetKeys = shape.key.map((k) => `t.${q(k.name)}`);
      const groups = plan.groups.map((g) => `(${g.expression})::text`);
      const names = driving.keyColumns.map((_, i) => q(`k${i + 1}`));
      sql = `WITH rows AS (
               SELECT ${list(drivingKeys.map((k, i) => `${k} AS ${names[i]}`))}
                 FROM (${sampled(`${driving.table} s`, drivingKeys, '$1', '$2')}) s)
             SELECT DISTINCT ARRAY[${list(groups)}] AS k
               FROM ${plan.fromSql}
              WHERE ${restrictedWhere(
                `${tuple(driving.keyColumns.map((k) => col(driving.alias, k)))} IN (SELECT ${list(names)} FROM rows)`,
                plan.where,
              )}
             UNION
             SELECT ARRAY[${list(targetKeys.map((k) => `${k}::text`))}]
               FROM (${sampled(`${plan.targetSql} t`, targetKeys, '$3', '$4')}) t`;
    }
    const rows = await session.query<{ k: Key }>(sql, params);
    return rows.map((r) => r.k);
  });
  return {
    count: keys.length,
    *batches(n: number) {
      for (let i = 0; i < keys.length; i += n) {
        const part = keys.slice(i, i + n);
        if (shape.kind === 'driving') {
          yield [part];
        } else {
          yield [part.filter((k) => !k.includes(null)), part.filter((k) => k.includes(null))];
        }
      }
    },
  };
}
