import type { Session } from '../db/session.js';
import { changedFromList } from '../drain/changed-sql.js';
import { loadPlan } from '../drain/plan.js';
import { rederiveSql } from '../drain/rederive-sql.js';
import { TrellisError, type TrellisErrorCode } from '../errors.js';
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
  /** The state it keeps besides its target (ADR 0069). */
  state: ExplainedState;
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

/** What a transform (or part) keeps besides its target, per source row or per group. */
export interface ExplainedState {
  /** Its key map's kind ('groups', 'rows', 'shadow'), or null for none. */
  keyMap: string | null;
  /** Whether it keeps a state row per group (aggregates kept by delta). */
  groupStates: boolean;
  /** The same in words. */
  description: string;
}

export interface Explanation {
  /** Whether it is defined (explain(target)), or a statement explained without defining it. */
  defined: boolean;
  /** The transform; null when a statement explained was refused. */
  target: string | null;
  /** As the catalog keeps it (normalised); a refused statement as given. */
  statement: string;
  /** Targets in the order a change flows through them (parts first, the transform last). */
  chain: string[];
  parts: ExplainedPart[];
  /**
   * For a statement explained before it is defined: null when it would be defined, else
   * what defining it would raise (no parts then).
   */
  refused: { code: TrellisErrorCode; message: string; hint: string | null } | null;
}

const MODES: Record<string, ExplainMode> = {
  delta: 'delta',
  group: 'group recompute',
  rows: 're-derive',
};

interface Row {
  id: number;
  name: string | null;
  target: string;
  statement: string;
  key: string[];
  maintenance: {
    mode: string;
    reason: string;
    aggregates: Array<{ call: string; how: string; why: string | null }>;
  };
  state: ExplainedState;
  reads: ExplainedRead[];
  needs: Array<{ table: string; columns: string[]; role: string; fix: string }>;
}

/** A part as explain() shows it, from one of `_explain_parts`'s rows. */
function part(row: Row, drainSql: string | null): ExplainedPart {
  return {
    name: row.name,
    target: row.target,
    statement: row.statement,
    key: row.key,
    mode: MODES[row.maintenance.mode] ?? 're-derive',
    why: row.maintenance.reason,
    aggregates: row.maintenance.aggregates,
    state: row.state,
    reads: row.reads,
    needs: row.needs,
    drainSql,
  };
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
  const [found] = await session.query<{ parts: Row[] }>(`SELECT ${s}._explain_parts($1) AS parts`, [
    root.part_of ?? root.id,
  ]);
  const parts: ExplainedPart[] = [];
  for (const row of found?.parts ?? []) {
    let drainSql: string | null = null;
    try {
      drainSql = rederiveSql(await loadPlan(session, schema, row.id), changedFromList());
    } catch (error) {
      // Capture not installed yet: the plan has no source ids to name.
      if (!(error instanceof Error) || !error.message.includes('is not installed yet')) throw error;
    }
    parts.push(part(row, drainSql));
  }
  const self = parts[parts.length - 1]!;
  return {
    target: self.target,
    statement: self.statement,
    chain: parts.map((p) => p.target),
    parts,
    defined: true,
    refused: null,
  };
}

/**
 * Whether explain()'s argument is a statement (`[EXPLAIN] TRANSFORM …`) rather than the
 * name of a defined transform (a name holds no whitespace).
 */
export function isExplainStatement(arg: string): boolean {
  return /^\s*(explain\s+)?transform\s/i.test(arg);
}

/**
 * Explains a TRANSFORM statement without defining it (`EXPLAIN TRANSFORM`, ADR 0069): the
 * catalog's explain(statement) defines it in a subtransaction, reads its parts and rolls
 * it back. A refused statement gives `refused` (the code and message defining it would
 * raise) and no parts. No drain SQL: capture is not installed for what is not defined.
 */
export async function explainStatement(
  session: Session,
  schema: string,
  statement: string,
): Promise<Explanation> {
  const [row] = await session.query<{
    e: {
      target: string | null;
      statement: string;
      chain: string[];
      parts: Row[];
      refused: { code: string; message: string; hint: string | null } | null;
    };
  }>(`SELECT ${quoteIdent(schema)}.explain($1) AS e`, [statement]);
  const e = row!.e;
  return {
    target: e.target,
    statement: e.statement,
    chain: e.chain,
    parts: e.parts.map((p) => part(p, null)),
    defined: false,
    refused: e.refused
      ? {
          code: REFUSAL_CODES[e.refused.code] ?? 'validation',
          message: e.refused.message,
          hint: e.refused.hint,
        }
      : null,
  };
}

/** The TrellisError code of each of the catalog's refusal SQLSTATEs (db/classify.ts). */
const REFUSAL_CODES: Record<string, TrellisErrorCode> = {
  TRP01: 'parse',
  TRV01: 'validation',
  TRC01: 'conflict',
  TRN01: 'not_found',
};

/** An explanation as text (the CLI's `trellis explain`). */
export function formatExplanation(e: Explanation): string {
  if (e.refused) {
    const hint = e.refused.hint ? `\n  hint: ${e.refused.hint}` : '';
    return `refused (${e.refused.code}): ${e.refused.message}${hint}\n  ${e.statement}\n`;
  }
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
    lines.push(`  state: ${p.state.description}`);
    for (const r of p.reads) {
      const by = r.writtenBy.length ? `, written by ${r.writtenBy.join(', ')}` : '';
      const idx = r.indexes.map((i) => `${i.name} (${i.columns.join(', ')})`).join('; ');
      lines.push(`  reads ${r.table} AS ${r.alias}${by}; indexes used: ${idx || 'none'}`);
    }
    for (const n of p.needs) lines.push(`  needs: ${n.fix}`);
    if (p.drainSql) {
      lines.push('  drain SQL for changed keys ($1):');
      for (const l of p.drainSql.split('\n')) lines.push(`    ${l}`);
    } else if (e.defined) {
      lines.push('  drain SQL: not yet (capture of its sources is being installed)');
    } else {
      lines.push('  drain SQL: once defined (capture of its sources installed)');
    }
  }
  return `${lines.join('\n')}\n`;
}
