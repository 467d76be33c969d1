import type { Session } from '../db/session.js';
import { changedFromList } from '../drain/changed-sql.js';
import { loadPlan } from '../drain/plan.js';
import { rederiveSql } from '../drain/rederive-sql.js';
import { TrellisError } from '../errors.js';
import { quoteIdent } from '../identifiers.js';

/**
 * How a transform is kept (`Trellis.explain()`, `trellis explain`; ADR 0059): its parts in
 * the order a change flows through them, how each is maintained and why, the source
 * indexes each uses or needs, and the SQL the drain runs for a changed key.
 */

/** How a transform (or a part) is maintained, as `explain()` names it. */
export type ExplainMode = 'delta' | 'group recompute' | 're-derive';

/** A table a transform (or a part) reads, and the index each of its changes is found by. */
export interface ExplainedRead {
  /** Schema-qualified. */
  table: string;
  alias: string;
  /** `null` for the FROM table. */
  join: 'inner' | 'left' | null;
  keyColumns: string[];
  /**
   * What writes it, when not the app: the part whose target it is, or the branches of a
   * union mirrored into a union's table (targets).
   */
  writtenBy: string[];
  /** Indexes of the table the drain finds changed rows' targets by (name: its columns). */
  indexes: Array<{ name: string; columns: string[] }>;
}

/** One transform of the chain: a part, or the transform itself (the last). */
export interface ExplainedPart {
  /** Its name in the transform (a WITH query's, a derived table's alias, a union branch's number); null for the transform itself. */
  name: string | null;
  target: string;
  statement: string;
  key: string[];
  mode: ExplainMode;
  /** Why it is kept so (for a GROUP BY, which aggregates are kept by delta and why not). */
  why: string;
  aggregates: Array<{ call: string; how: string; why: string | null }>;
  reads: ExplainedRead[];
  /** Source indexes it needs and lacks, each with the statement that makes it. */
  needs: Array<{ table: string; columns: string[]; role: string; fix: string }>;
  /**
   * The statement the drain runs for changed keys (`$1`: a JSON array of
   * `{"s": source id, "k": [key as text, …]}`); null until capture of its sources is
   * installed (the first staging pass after it was defined).
   */
  drainSql: string | null;
}

export interface Explanation {
  target: string;
  statement: string;
  /** Targets in the order a change flows through them (parts first, the transform last). */
  chain: string[];
  parts: ExplainedPart[];
}

const MODES: Record<string, ExplainMode> = {
  delta: 'delta',
  group: 'group recompute',
  rows: 're-derive',
};

interface Row {
  id: number;
  part_name: string | null;
  target: string;
  statement: string;
  key: string[];
  maintenance: {
    mode: string;
    reason: string;
    aggregates: Array<{ call: string; how: string; why: string | null }>;
  };
  reads: ExplainedRead[];
  needs: Array<{ table: string; columns: string[]; role: string; fix: string }>;
}

/** Explains transform `target` (one users defined; a part is explained with its transform). */
export async function explainTransform(
  session: Session,
  schema: string,
  target: string,
): Promise<Explanation> {
  const s = quoteIdent(schema);
  const [root] = await session.query<{ id: number; part_of: number | null }>(
    `SELECT t.id, t.part_of FROM ${s}.transforms t WHERE t.target_name = $1 AND t.redefines IS NULL`,
    [target],
  );
  if (!root) throw new TrellisError('not_found', `there is no transform named ${target}`);
  const rootId = root.part_of ?? root.id;
  const rows = await session.query<Row>(
    `SELECT t.id, t.part_name, t.target_name AS target, t.statement,
            ARRAY(SELECT c.name::text FROM ${s}.transform_columns c
                   WHERE c.transform_id = t.id AND c.is_key ORDER BY c.ordinal) AS key,
            ${s}._maintenance(t.aggregates, t.delta) AS maintenance,
            coalesce((
              SELECT jsonb_agg(jsonb_build_object(
                       'table', ts.source_schema || '.' || ts.source_name, 'alias', ts.alias,
                       'join', ts.join_type, 'keyColumns', to_jsonb(ts.key_columns),
                       'writtenBy', to_jsonb(ARRAY(
                          SELECT u.target_name::text FROM ${s}.transforms u
                           WHERE u.id IN (SELECT ${s}._upstream_ids(t.id))
                             AND (u.target_oid = ts.source_oid
                                  OR u.id IN (SELECT f.transform_id FROM ${s}.union_feeds f
                                               WHERE f.table_oid = ts.source_oid))
                           ORDER BY u.id)),
                       'indexes', coalesce((
                         SELECT jsonb_agg(jsonb_build_object('name', ic.relname, 'columns', to_jsonb(ARRAY(
                                  SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, o)
                                    JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                                   ORDER BY k.o))) ORDER BY ic.relname)
                           FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid
                          WHERE x.indrelid = ts.source_oid AND x.indisvalid
                            AND (SELECT a.attname FROM pg_attribute a
                                  WHERE a.attrelid = x.indrelid AND a.attnum = x.indkey[0])
                                = ANY (ts.key_columns || ts.join_columns || ts.group_columns)), '[]'))
                     ORDER BY ts.ordinal)
                FROM ${s}.transform_sources ts WHERE ts.transform_id = t.id), '[]') AS reads,
            coalesce((
              SELECT jsonb_agg(jsonb_build_object('table', g->'table', 'columns', g->'columns',
                                                  'role', g->'role', 'fix', g->'fix'))
                FROM jsonb_array_elements(${s}.source_index_gaps(t.id)) g
               WHERE NOT coalesce((g->>'opted_out')::boolean, false)), '[]') AS needs
       FROM ${s}.transforms t
      WHERE t.id = $1 OR t.part_of = $1
      ORDER BY (t.id = $1), t.id`,
    [rootId],
  );
  const parts: ExplainedPart[] = [];
  for (const row of rows) {
    let drainSql: string | null = null;
    try {
      drainSql = rederiveSql(await loadPlan(session, schema, row.id), changedFromList());
    } catch (error) {
      // Capture not installed yet: the plan has no source ids to name.
      if (!(error instanceof Error) || !error.message.includes('is not installed yet')) throw error;
    }
    parts.push({
      name: row.id === rootId ? null : row.part_name,
      target: row.target,
      statement: row.statement,
      key: row.key,
      mode: MODES[row.maintenance.mode] ?? 're-derive',
      why: row.maintenance.reason,
      aggregates: row.maintenance.aggregates,
      reads: row.reads,
      needs: row.needs,
      drainSql,
    });
  }
  const self = parts[parts.length - 1]!;
  return {
    target: self.target,
    statement: self.statement,
    chain: parts.map((p) => p.target),
    parts,
  };
}

/** An explanation as text (the CLI's `trellis explain`). */
export function formatExplanation(e: Explanation): string {
  const lines: string[] = [`transform ${e.target}`, `  ${e.statement}`];
  if (e.parts.length > 1) lines.push(`chain: ${e.chain.join(' -> ')}`);
  for (const p of e.parts) {
    lines.push('');
    lines.push(p.name === null ? `${p.target} (the transform):` : `part ${p.name} (${p.target}):`);
    if (p.name !== null) lines.push(`  ${p.statement}`);
    lines.push(`  maintenance: ${p.mode}: ${p.why}`);
    for (const a of p.aggregates) {
      lines.push(`    ${a.call}: ${a.how}${a.why ? ` (${a.why})` : ''}`);
    }
    lines.push(`  key: ${p.key.length ? p.key.join(', ') : '(none: one row)'}`);
    for (const r of p.reads) {
      const by = r.writtenBy.length ? `, written by ${r.writtenBy.join(', ')}` : '';
      const idx = r.indexes.map((i) => `${i.name} (${i.columns.join(', ')})`).join('; ');
      lines.push(`  reads ${r.table} AS ${r.alias}${by}; indexes used: ${idx || 'none'}`);
    }
    for (const n of p.needs) lines.push(`  needs: ${n.fix}`);
    if (p.drainSql) {
      lines.push('  drain SQL for changed keys ($1):');
      for (const l of p.drainSql.split('\n')) lines.push(`    ${l}`);
    } else {
      lines.push('  drain SQL: not yet (capture of its sources is being installed)');
    }
  }
  return `${lines.join('\n')}\n`;
}
