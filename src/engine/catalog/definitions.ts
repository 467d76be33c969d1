import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';

/** A column of a transform's target. */
export interface DefinitionColumn {
  name: string;
  /** The Postgres type, as `format_type` writes it. */
  type: string;
  /** The expression the column is derived from (a key column Trellis added: the source column). */
  expression: string;
  /** Part of the target's key. */
  key: boolean;
  /** Added by Trellis to carry the key; not in the SELECT list. */
  implicit: boolean;
}

/** A table a transform reads. */
export interface DefinitionSource {
  /** Schema-qualified name, as `schema.table`. */
  table: string;
  alias: string;
  /** `null` for the FROM source. */
  join: 'inner' | 'left' | null;
  keyColumns: string[];
}

/** A registered transform definition, as `definitions()` lists it. */
export interface Definition {
  /** The target table's name (in the target schema). */
  target: string;
  targetSchema: string;
  /** The normalised statement; applying it again defines the same transform. */
  statement: string;
  sources: DefinitionSource[];
  columns: DefinitionColumn[];
  options: { withoutSourceIndex: boolean };
  aggregates: boolean;
  createdAt: Date;
  updatedAt: Date;
}

interface DefinitionRow {
  target_name: string;
  target_schema: string;
  statement: string;
  aggregates: boolean;
  without_source_index: boolean;
  created_at: Date;
  updated_at: Date;
  sources: Array<{
    schema: string;
    name: string;
    alias: string;
    join_type: 'inner' | 'left' | null;
    key_columns: string[];
  }>;
  columns: Array<{
    name: string;
    type: string;
    expression: string;
    is_key: boolean;
    implicit: boolean;
  }>;
}

/** Every registered transform, by target name; or one, when `target` is given. */
export async function readDefinitions(
  session: Session,
  schema: string,
  target?: string,
): Promise<Definition[]> {
  const s = quoteIdent(schema);
  const rows = await session.query<DefinitionRow>(
    `SELECT t.target_name, t.target_schema, t.statement, t.aggregates, t.without_source_index,
            t.created_at, t.updated_at,
            (SELECT jsonb_agg(jsonb_build_object(
                      'schema', s.source_schema, 'name', s.source_name, 'alias', s.alias,
                      'join_type', s.join_type, 'key_columns', to_jsonb(s.key_columns))
                    ORDER BY s.ordinal)
               FROM ${s}.transform_sources s WHERE s.transform_id = t.id) AS sources,
            (SELECT jsonb_agg(jsonb_build_object(
                      'name', c.name, 'type', c.type, 'expression', c.expression,
                      'is_key', c.is_key, 'implicit', c.implicit)
                    ORDER BY c.ordinal)
               FROM ${s}.transform_columns c WHERE c.transform_id = t.id) AS columns
       FROM ${s}.transforms t
      WHERE $1::text IS NULL OR t.target_name = $1
      ORDER BY t.target_name`,
    [target ?? null],
  );
  return rows.map((r) => ({
    target: r.target_name,
    targetSchema: r.target_schema,
    statement: r.statement,
    sources: (r.sources ?? []).map((src) => ({
      table: `${src.schema}.${src.name}`,
      alias: src.alias,
      join: src.join_type,
      keyColumns: src.key_columns,
    })),
    columns: (r.columns ?? []).map((c) => ({
      name: c.name,
      type: c.type,
      expression: c.expression,
      key: c.is_key,
      implicit: c.implicit,
    })),
    options: { withoutSourceIndex: r.without_source_index },
    aggregates: r.aggregates,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  }));
}
