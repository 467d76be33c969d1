import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { SourceIndexGap } from './status-types.js';

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

/** How one aggregate call of a definition is kept (ADR 0044). */
export interface AggregateMaintenance {
  /** The call as written, FILTER included: `sum(amount) FILTER (WHERE paid)`. */
  call: string;
  /**
   * - `delta`: each changed row's contribution is applied to its groups;
   * - `delta+rescan`: the same, and a group's extreme (min, max, the largest numeric
   *   scale) is read again from its rows when a change removes it;
   * - `recompute`: the group is recomputed from all its rows when one of them changes.
   */
  how: 'delta' | 'delta+rescan' | 'recompute';
  /** Why it cannot be kept by delta (null when it is). */
  why: string | null;
}

/**
 * How a transform is kept up to date when its sources change.
 * - `rows`: a projection, filter or join: each changed key's target rows re-derived;
 * - `delta`: every aggregate has an exact delta (see `aggregates`);
 * - `group`: each changed group recomputed from its rows (`reason` says which aggregate
 *   or expression needs that).
 */
export interface Maintenance {
  mode: 'rows' | 'delta' | 'group';
  reason: string;
  /** Each aggregate call (none for `rows`). */
  aggregates: AggregateMaintenance[];
}

/**
 * A hidden part of a transform written as a view's SQL (ADR 0056): one of its WITH queries
 * or derived tables (subqueries in FROM), kept as a chained transform whose target the
 * statement around it reads.
 */
export interface DefinitionPart {
  /** The WITH query's name or the derived table's alias (`outer.inner` when nested). */
  name: string;
  /** Its hidden target, in the target schema: `trellis#<transform>#<name>`. */
  target: string;
  /** Its own statement, as the engine keeps it. */
  statement: string;
  /** The key its rows are read by. */
  key: string[];
  maintenance: Maintenance;
  /**
   * The source indexes its changes are found by and the sources lack, as
   * `status().sourceIndexGaps` lists a transform's (a part has no status of its own in
   * `trellis status`).
   */
  sourceIndexGaps: SourceIndexGap[];
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
  options: {
    withoutSourceIndex: boolean;
    /** Defined `WITHOUT ROW SECURITY`: sources with row level security accepted (ADR 0034). */
    withoutRowSecurity: boolean;
  };
  /**
   * The settings its expressions are evaluated under, recorded when it was defined (those
   * of the session that defined it) or set by `ALTER TRANSFORM … SET (…)`: lower-case
   * names (`timezone`, `datestyle`, `intervalstyle`, `extra_float_digits`, `lc_time`…) to
   * values as Postgres shows them.
   */
  settings: Record<string, string>;
  aggregates: boolean;
  maintenance: Maintenance;
  /**
   * Its WITH queries and subqueries in FROM, each kept as a hidden chained transform (in
   * the order they were defined); absent when it has none.
   */
  parts?: DefinitionPart[];
  createdAt: Date;
  updatedAt: Date;
}

/** The JSON `<schema>.definitions()` returns a row of: the Definition, times as ISO text. */
type DefinitionJson = Omit<Definition, 'createdAt' | 'updatedAt'> & {
  createdAt: string;
  updatedAt: string;
};

/**
 * Every registered transform, by target name; or one, when `target` is given. What
 * `<schema>.definitions()` returns (migration 0017, callable from psql), times as Dates.
 */
export async function readDefinitions(
  session: Session,
  schema: string,
  target?: string,
): Promise<Definition[]> {
  const rows = await session.query<{ d: DefinitionJson }>(
    `SELECT d FROM ${quoteIdent(schema)}.definitions() d
      WHERE $1::text IS NULL OR d->>'target' = $1`,
    [target ?? null],
  );
  return rows.map(({ d }) => ({
    ...d,
    createdAt: new Date(d.createdAt),
    updatedAt: new Date(d.updatedAt),
  }));
}
