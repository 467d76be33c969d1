import type { Session } from '../db/session.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';
import { type Classification, type DeltaPlan, deltaPlan } from './delta-plan.js';

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
  /** Its join condition (null for the FROM table). */
  joinCondition: string | null;
}

/**
 * A source occurrence's columns in a shadow key map (see _make_key_map in
 * 0033_source_shadows.sql): each column the definition reads of it, and its key, by name
 * and as the map's column.
 */
export interface ShadowSource {
  ordinal: number;
  /** `type`: the column's type (and collation), as the map declares it. */
  columns: Array<{ name: string; col: string; type?: string }>;
}

/** A target column, as the drain writes it. */
export interface PlanColumn {
  name: string;
  expression: string;
  isKey: boolean;
  /** Left as it is while paused. */
  paused: boolean;
  notNull: boolean;
}

/** Everything the drain and backfill need to re-derive one transform's rows. */
export interface TransformPlan {
  id: number;
  /** Trellis's catalog schema, quoted. */
  catalog: string;
  target: string;
  /** Quoted, schema-qualified target table. */
  targetSql: string;
  searchPath: string;
  /**
   * The settings its expressions are evaluated under (TimeZone, DateStyle...), as recorded
   * when it was defined: `{ timezone: 'UTC', ... }` (ENGINE.md, I10; ADR 0033).
   */
  settings: Record<string, string>;
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
  /** Whether any key is held back from the whole transform (the drain then skips them). */
  hasHeldKeys: boolean;
  /**
   * Columns some keys are held for (their rows flow, that column keeps its last value:
   * see rederive-sql.ts). Never for an aggregating transform.
   */
  heldColumns: string[];
  /** GROUP BY expressions, typed (empty unless the transform groups). */
  groups: Array<{ expression: string; type: string }>;
  /**
   * The key map (quoted, qualified; see _create_key_map in 0009_source_changes.sql):
   * 'groups' for a GROUP BY (with each row's group and whether it passes WHERE; every join
   * row of a join, only the passing rows of a single table), 'rows' for a join with a WHERE
   * (every join row's keys), 'shadow' for a GROUP BY over a join that fans out (the columns
   * it reads of each source occurrence, one row per source row: see shadow-sql.ts); null
   * for none.
   */
  mapSql: string | null;
  mapKind: 'groups' | 'rows' | 'shadow' | null;
  /** The shadow's columns per source occurrence (mapKind 'shadow'), else null. */
  shadow: ShadowSource[] | null;
  /**
   * How its aggregates are kept by delta (delta-sql.ts), with the group state table; null
   * when they are not (a transform that does not aggregate, or one whose groups are
   * recomputed from their rows: see `classification`).
   */
  delta: DeltaPlan | null;
  /** An aggregating transform's classification (transforms.delta), null otherwise. */
  classification: Classification | null;
}

interface PlanRow {
  id: number;
  has_held_keys: boolean;
  held_columns: string[];
  target_name: string;
  target_sql: string;
  search_path: string;
  settings: Record<string, string>;
  aggregates: boolean;
  delta: Classification | null;
  /** FROM with its joins, naming each source as it is now (a renamed source is followed). */
  from_sql: string;
  spec: {
    key: string[];
    ast: { where: string | null; group_by: string[]; having: string | null };
    groups?: Array<{ expr: string; type: string }>;
    key_map?: 'groups' | 'rows' | 'shadow' | null;
    shadow?: Array<{
      ordinal: number;
      columns: Array<{ name: string; col: string; type?: string }>;
    }>;
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
    join_condition: string | null;
  }>;
  columns: Array<{
    name: string;
    expression: string;
    is_key: boolean;
    paused: boolean;
    notnull: boolean | null;
  }>;
}

/** The shadow's columns of a transform whose key map is a shadow (spec.shadow). */
function shadowOf(row: PlanRow): ShadowSource[] {
  const shadow = row.spec.shadow;
  if (!shadow || shadow.length !== row.sources.length) {
    // Recorded with the map by _make_key_map: remade with it (a build, a followed change).
    throw new TrellisError('conflict', `the key map of ${row.target_name} is being made again`);
  }
  return shadow.map((x) => ({
    ordinal: x.ordinal,
    columns: x.columns.map((c) => ({
      name: c.name,
      col: c.col,
      ...(c.type ? { type: c.type } : {}),
    })),
  }));
}

/** Reads a transform's plan from the catalog. */
export async function loadPlan(
  session: Session,
  schema: string,
  transformId: number,
): Promise<TransformPlan> {
  const s = quoteIdent(schema);
  const [row] = await session.query<PlanRow>(
    `SELECT t.id, t.target_name, t.target_oid::regclass::text AS target_sql, t.search_path, t.settings,
            EXISTS (SELECT 1 FROM ${s}.held_keys h
                     WHERE h.transform_id = t.id AND h.column_name = '') AS has_held_keys,
            ARRAY(SELECT DISTINCT h.column_name::text FROM ${s}.held_keys h
                   WHERE h.transform_id = t.id AND h.column_name <> '' ORDER BY 1) AS held_columns,
            t.aggregates, t.spec, t.delta,
            (SELECT string_agg(
                      CASE WHEN ts.ordinal = 0 THEN '' WHEN ts.join_type = 'left' THEN ' LEFT JOIN '
                           ELSE ' JOIN ' END
                      || quote_ident(n.nspname) || '.' || quote_ident(c.relname) || ' AS ' || quote_ident(ts.alias)
                      || CASE WHEN ts.ordinal > 0 THEN ' ON (' || ts.join_condition || ')' ELSE '' END,
                      '' ORDER BY ts.ordinal)
               FROM ${s}.transform_sources ts
               JOIN pg_class c ON c.oid = ts.source_oid JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE ts.transform_id = t.id) AS from_sql,
            (SELECT jsonb_agg(jsonb_build_object(
                      'ordinal', ts.ordinal, 'source_id', src.id, 'alias', ts.alias,
                      'table', quote_ident(n.nspname) || '.' || quote_ident(c.relname),
                      'key_columns', ts.key_columns, 'key_types', ts.key_types,
                      'target_key_columns', ts.target_key_columns, 'join_type', ts.join_type,
                      'join_condition', ts.join_condition)
                    ORDER BY ts.ordinal)
               FROM ${s}.transform_sources ts
               JOIN pg_class c ON c.oid = ts.source_oid JOIN pg_namespace n ON n.oid = c.relnamespace
               LEFT JOIN ${s}.sources src ON src.source_oid = ts.source_oid
              WHERE ts.transform_id = t.id) AS sources,
            (SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'expression', c.expression, 'is_key', c.is_key,
                      'paused', c.paused_at IS NOT NULL,
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
  if (
    row.sources === null ||
    row.sources.length !== (row.spec as { sources?: unknown[] }).sources?.length
  ) {
    // A source table is gone: the staging worker stops the transform (captureFailure).
    throw new TrellisError('conflict', `a source table of ${row.target_name} no longer exists`);
  }
  // A grand total (aggregates, no GROUP BY) needs no key map: any change recomputes its one
  // row. Yet one over a join with a WHERE is given a 'rows' map (_key_map_kind in
  // 0009_source_changes.sql looks at joins and WHERE only), whose layout the aggregate
  // paths do not write: its build failed on it. The drain leaves that map alone (empty).
  const keyMap = row.aggregates && row.spec.key_map === 'rows' ? null : (row.spec.key_map ?? null);
  return {
    id: row.id,
    catalog: quoteIdent(schema),
    target: row.target_name,
    targetSql: row.target_sql,
    searchPath: row.search_path,
    settings: row.settings,
    aggregates: row.aggregates,
    fromSql: row.from_sql,
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
      joinCondition: src.join_condition,
    })),
    columns: row.columns.map((c) => ({
      name: c.name,
      expression: c.expression,
      isKey: c.is_key,
      paused: c.paused,
      notNull: c.notnull === true,
    })),
    key: row.spec.key,
    hasHeldKeys: row.has_held_keys,
    heldColumns: row.held_columns,
    groups: (row.spec.groups ?? []).map((g) => ({ expression: g.expr, type: g.type })),
    mapSql: keyMap ? `${quoteIdent(schema)}.${quoteIdent(`map_${row.id}`)}` : null,
    mapKind: keyMap,
    shadow: keyMap === 'shadow' ? shadowOf(row) : null,
    delta: deltaPlan(row.delta, `${quoteIdent(schema)}.${quoteIdent(`groups_${row.id}`)}`),
    classification: row.delta,
  };
}
