import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';

/** A table a transform reads, as the drain needs it. */
export interface PlanSource {
  ordinal: number;
  /** The table, quoted and schema-qualified. */
  table: string;
  /** Its id in `<schema>.sources` (the ledger's source_id); null until capture is installed. */
  sourceId: number | null;
  alias: string;
  keyColumns: string[];
  keyTypes: string[];
  /** The target columns holding this source's key (null when the transform aggregates). */
  targetKeyColumns: string[] | null;
  joinType: 'inner' | 'left' | null;
}

/** A target column, as the drain writes it. */
export interface PlanColumn {
  name: string;
  expression: string;
  isKey: boolean;
  /** Left as it is while paused. */
  paused: boolean;
  /** Its type has `=`; otherwise compared as text to skip no-op updates. */
  comparable: boolean;
  notNull: boolean;
}

/** Everything the drain and backfill need to re-derive one transform's rows. */
export interface TransformPlan {
  id: number;
  target: string;
  /** Quoted, schema-qualified target table. */
  targetSql: string;
  searchPath: string;
  aggregates: boolean;
  /** FROM with its joins, tables quoted and qualified, as the definition was validated. */
  fromSql: string;
  where: string | null;
  groupBy: string[];
  having: string | null;
  sources: PlanSource[];
  columns: PlanColumn[];
  /** The target's key columns, in key order (empty for a grand total). */
  key: string[];
  /** Whether any key is held back from this transform (the drain then skips them). */
  hasHeldKeys: boolean;
  /** GROUP BY expressions, typed (empty unless the transform groups). */
  groups: Array<{ expression: string; type: string }>;
  /** The key map of a GROUP BY transform (quoted, qualified); null otherwise. */
  mapSql: string | null;
}

interface PlanRow {
  id: number;
  has_held_keys: boolean;
  target_name: string;
  target_sql: string;
  search_path: string;
  aggregates: boolean;
  spec: {
    from_sql: string;
    key: string[];
    ast: { where: string | null; group_by: string[]; having: string | null };
    groups?: Array<{ expr: string; type: string }>;
  };
  sources: Array<{
    ordinal: number;
    table: string;
    source_id: number | null;
    alias: string;
    key_columns: string[];
    key_types: string[];
    target_key_columns: string[] | null;
    join_type: 'inner' | 'left' | null;
  }>;
  columns: Array<{
    name: string;
    expression: string;
    is_key: boolean;
    paused: boolean;
    comparable: boolean;
    notnull: boolean | null;
  }>;
}

/** Reads a transform's plan from the catalog. */
export async function loadPlan(
  session: Session,
  schema: string,
  transformId: number,
): Promise<TransformPlan> {
  const s = quoteIdent(schema);
  const [row] = await session.query<PlanRow>(
    `SELECT t.id, t.target_name, t.target_oid::regclass::text AS target_sql, t.search_path,
            EXISTS (SELECT 1 FROM ${s}.held_keys h WHERE h.transform_id = t.id) AS has_held_keys,
            t.aggregates, t.spec,
            (SELECT jsonb_agg(jsonb_build_object(
                      'ordinal', ts.ordinal, 'source_id', src.id, 'alias', ts.alias,
                      'table', quote_ident(ts.source_schema) || '.' || quote_ident(ts.source_name),
                      'key_columns', ts.key_columns, 'key_types', ts.key_types,
                      'target_key_columns', ts.target_key_columns, 'join_type', ts.join_type)
                    ORDER BY ts.ordinal)
               FROM ${s}.transform_sources ts
               LEFT JOIN ${s}.sources src ON src.source_oid = ts.source_oid
              WHERE ts.transform_id = t.id) AS sources,
            (SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'expression', c.expression, 'is_key', c.is_key,
                      'paused', c.paused_at IS NOT NULL,
                      'comparable', EXISTS (
                        SELECT 1 FROM pg_operator o
                         WHERE o.oprname = '=' AND o.oprleft = a.atttypid AND o.oprright = a.atttypid),
                      'notnull', a.attnotnull)
                    ORDER BY c.ordinal)
               FROM ${s}.transform_columns c
               LEFT JOIN pg_attribute a ON a.attrelid = t.target_oid AND a.attname = c.name
              WHERE c.transform_id = t.id) AS columns
       FROM ${s}.transforms t
      WHERE t.id = $1`,
    [transformId],
  );
  if (!row) throw new TrellisError('not_found', `transform ${transformId} no longer exists`);
  return {
    id: row.id,
    target: row.target_name,
    targetSql: row.target_sql,
    searchPath: row.search_path,
    aggregates: row.aggregates,
    fromSql: row.spec.from_sql,
    where: row.spec.ast.where,
    groupBy: row.spec.ast.group_by ?? [],
    having: row.spec.ast.having,
    sources: row.sources.map((src) => ({
      ordinal: src.ordinal,
      table: src.table,
      sourceId: src.source_id,
      alias: src.alias,
      keyColumns: src.key_columns,
      keyTypes: src.key_types,
      targetKeyColumns: src.target_key_columns,
      joinType: src.join_type,
    })),
    columns: row.columns.map((c) => ({
      name: c.name,
      expression: c.expression,
      isKey: c.is_key,
      paused: c.paused,
      comparable: c.comparable,
      notNull: c.notnull === true,
    })),
    key: row.spec.key,
    hasHeldKeys: row.has_held_keys,
    groups: (row.spec.groups ?? []).map((g) => ({ expression: g.expr, type: g.type })),
    mapSql:
      (row.spec.groups ?? []).length > 0
        ? `${quoteIdent(schema)}.${quoteIdent(`map_${row.id}`)}`
        : null,
  };
}
