/**
 * How a transform's aggregates are kept by delta (migration 0026, ADR 0044): the catalog's
 * classification (`<schema>.transforms.delta`) as the drain uses it, and the group state
 * table's columns each aggregate keeps.
 */

/** How one aggregate's state is kept and combined (see delta-sql.ts). */
export type DeltaKind =
  | 'count'
  | 'sum_int'
  | 'sum_int8'
  | 'avg_int'
  | 'sum_numeric'
  | 'avg_numeric'
  | 'min'
  | 'max'
  | 'bool_and'
  | 'bool_or';

/** One aggregate call of the definition, as the catalog classified it. */
export interface ClassifiedAggregate {
  /** The call as written, FILTER included (`sum(amount) FILTER (WHERE paid)`). */
  call: string;
  /** null when it has no exact delta (then `why` says so). */
  kind: DeltaKind | null;
  delta: boolean;
  why: string | null;
  /** 1-based index into `inputs`: the key map column `i<n>` holding its input per row. */
  input: number | null;
  /** Its result type (format_type). */
  type: string;
  collation: string | null;
  /** sum/avg of numeric: the display scale every input has (numeric(p,s)), or null when tracked. */
  scale: number | null;
}

/** The catalog's classification of an aggregating transform (transforms.delta). */
export interface Classification {
  mode: 'delta' | 'group';
  reason: string;
  aggs: ClassifiedAggregate[];
  /** Key map columns i1..: each join row's aggregate inputs, as expressions over the sources. */
  inputs: Array<{ expr: string; type: string; collation: string | null }>;
  /** Each non-key column as an expression over the aggregates' results, `"trellis#a<n>"`. */
  items: Record<string, string>;
  /** HAVING, the same way; null without one. */
  having: string | null;
  /**
   * Classified by the upgrade to delta maintenance, for a transform defined before it: kept
   * by group recompute until its next build switches it (migration 0026).
   */
  pending?: boolean;
}

/** An aggregate kept by delta (kind known). */
export interface DeltaAggregate extends ClassifiedAggregate {
  kind: DeltaKind;
  /** Its position, 1-based: state columns are named `a<n>_<part>`. */
  n: number;
}

/** What the drain needs to keep a transform's aggregates by delta. */
export interface DeltaPlan {
  aggregates: DeltaAggregate[];
  inputs: Classification['inputs'];
  items: Record<string, string>;
  having: string | null;
  /** The group state table (quoted, qualified). */
  statesSql: string;
}

/** The parts of one aggregate's state, each a column `a<n>_<part>` of the group state table. */
export type StatePart = 'c' | 's' | 'nan' | 'pinf' | 'ninf' | 'ms' | 'msc' | 'm' | 'b';

const NUMERIC: DeltaKind[] = ['sum_numeric', 'avg_numeric'];

/** Whether an aggregate's display scale is tracked (a numeric input of no fixed scale). */
export function tracksScale(a: DeltaAggregate): boolean {
  return NUMERIC.includes(a.kind) && a.scale === null;
}

/** Whether a change can remove an aggregate's state that then has to be read again (a rescan). */
export function mayRescan(a: DeltaAggregate): boolean {
  return a.kind === 'min' || a.kind === 'max' || tracksScale(a);
}

/** The state parts an aggregate keeps, with their SQL types (as migration 0026 creates them). */
export function stateParts(a: DeltaAggregate): Array<{ part: StatePart; type: string }> {
  const parts: Array<{ part: StatePart; type: string }> = [{ part: 'c', type: 'bigint' }];
  if (a.kind === 'count') return parts;
  if (a.kind === 'sum_int') parts.push({ part: 's', type: 'bigint' });
  if (a.kind === 'sum_int8' || a.kind === 'avg_int') parts.push({ part: 's', type: 'numeric' });
  if (NUMERIC.includes(a.kind)) {
    parts.push(
      { part: 's', type: 'numeric' },
      { part: 'nan', type: 'bigint' },
      { part: 'pinf', type: 'bigint' },
      { part: 'ninf', type: 'bigint' },
    );
    if (a.scale === null) parts.push({ part: 'ms', type: 'int' }, { part: 'msc', type: 'bigint' });
  }
  if (a.kind === 'min' || a.kind === 'max') {
    parts.push({ part: 'm', type: a.collation ? `${a.type} COLLATE ${a.collation}` : a.type });
  }
  if (a.kind === 'bool_and' || a.kind === 'bool_or') parts.push({ part: 'b', type: 'bigint' });
  return parts;
}

/** The drain's delta plan, from the catalog's classification (null unless kept by delta). */
export function deltaPlan(
  classification: Classification | null,
  statesSql: string,
): DeltaPlan | null {
  if (classification?.mode !== 'delta' || classification.pending) return null;
  return {
    aggregates: classification.aggs.map((a, i) => ({ ...a, kind: a.kind!, n: i + 1 })),
    inputs: classification.inputs,
    items: classification.items,
    having: classification.having,
    statesSql,
  };
}
