import type { ApplyMode } from './apply-choice.js';
import type { PlanSource, ShadowSource, TransformPlan } from './plan.js';
import {
  col,
  keyMatch,
  list,
  own,
  q,
  requireSourceIds,
  restrictedWhere,
  selectList,
  tuple,
  typedKeys,
  upsert,
} from './sql-parts.js';

/**
 * A GROUP BY over a join that fans out keeps a shadow of its sources as its key map
 * (`mapKind` 'shadow'; _make_key_map in 0033_source_shadows.sql; ADR 0051): for each
 * source occurrence (column `o`), every column the definition reads of it and its key, one
 * row per source row. The invariant: **the target is the definition computed over the
 * shadow**. A statement over the changed keys reads two states of the sources, both built
 * from the shadow: before (the shadow as it is) and after (the shadow with the changed
 * rows replaced by the sources' current rows of those keys, or gone). The groups the
 * changed rows' join rows fall in, in either state, are recomputed from the after state,
 * and the changed rows are replaced in the shadow: the invariant holds again. A source row
 * changed since the range, but not among its keys, is read as the shadow has it, so
 * nothing the drain has yet to apply leaks into a group.
 *
 * Its size follows the sources (each occurrence's rows, only the columns read), whatever
 * the join's row combinations; a change costs its join rows in both states and its
 * groups' rows. The join is evaluated over the shadow through its own indexes (each
 * occurrence's key, join columns and bare GROUP BY columns).
 *
 * A transform's ranges are applied one at a time (a join's are kept to one bucket,
 * ranges.ts): two statements on one group at once would each miss the other's rows.
 */

/**
 * A source occurrence's rows in a state: 'before' (the shadow as it is), 'after' (the
 * shadow with the changed keys' rows replaced by the sources' current rows of those keys),
 * 'union' (the shadow and the current rows of the changed keys: both versions of a changed
 * row), 'changed' (only the changed keys' rows, both versions).
 */
type State = 'before' | 'after' | 'union' | 'changed';

/**
 * The source ids whose changes a statement reads (a superset of those the `changed` CTE
 * holds), or null for every source of the transform: an occurrence of a source not among
 * them is read as the shadow has it in every state, and has no branch of its own.
 */
export type ChangedSources = ReadonlySet<number> | null;

function isChanged(source: PlanSource, changed: ChangedSources): boolean {
  return changed === null || changed.has(source.sourceId!);
}

/** The occurrences (with a source id) whose source may have changed keys. */
function changedOccurrences(plan: TransformPlan, changed: ChangedSources): PlanSource[] {
  return requireSourceIds(plan).filter((s) => isChanged(s, changed));
}

function shadowOf(plan: TransformPlan, source: PlanSource): ShadowSource {
  const shadow = plan.shadow?.find((x) => x.ordinal === source.ordinal);
  if (!shadow) throw new Error(`transform ${plan.target} keeps no shadow of ${source.alias}`);
  return shadow;
}

/** The shadow's columns of a source's key, in key order. */
function shadowKeys(plan: TransformPlan, source: PlanSource, alias: string): string[] {
  const shadow = shadowOf(plan, source);
  return source.keyColumns.map((k) => {
    const c = shadow.columns.find((x) => x.name === k);
    if (!c) throw new Error(`the shadow of ${source.alias} lacks its key column ${k}`);
    return `${alias}.${q(c.col)}`;
  });
}

/** The changed keys of a source, typed: a subquery over the `changed` CTE. */
function changedOf(source: PlanSource): string {
  return `SELECT ${list(typedKeys(source))} FROM changed c WHERE c.source_id = ${source.sourceId}`;
}

/** A source occurrence in a state, as a relation with its columns' names. */
function relation(
  plan: TransformPlan,
  source: PlanSource,
  state: State,
  changed: ChangedSources = null,
): string {
  const shadow = shadowOf(plan, source);
  const m = own('m');
  const before = `SELECT ${list(shadow.columns.map((c) => `${m}.${q(c.col)} AS ${q(c.name)}`))}
         FROM ${plan.mapSql} ${m} WHERE ${m}.o = ${source.ordinal}`;
  if (state === 'before' || (state !== 'changed' && !isChanged(source, changed))) {
    return `(${before})`;
  }
  const s = own('s');
  const current = `SELECT ${list(shadow.columns.map((c) => `${s}.${q(c.name)}`))} FROM ${source.table} ${s}
         WHERE ${tuple(source.keyColumns.map((k) => `${s}.${q(k)}`))} IN (${changedOf(source)})`;
  const kept =
    state === 'after'
      ? `\n          AND ${tuple(shadowKeys(plan, source, m))} NOT IN (${changedOf(source)})`
      : state === 'changed'
        ? `\n          AND ${tuple(shadowKeys(plan, source, m))} IN (${changedOf(source)})`
        : '';
  return `(${before}${kept}
        UNION ALL
        ${current})`;
}

/**
 * The definition's FROM over the sources in a state (the same aliases and conditions);
 * `only`, if given, the one occurrence read in state 'changed'; `upTo`, the occurrences
 * joined (a prefix).
 */
function fromIn(
  plan: TransformPlan,
  state: State,
  changed: ChangedSources = null,
  only: PlanSource | null = null,
  /** How many occurrences, in FROM order (all unless given): a prefix of the join. */
  upTo: number = plan.sources.length,
): string {
  return plan.sources
    .slice(0, upTo)
    .map((s, i) => {
      const rel = `${relation(plan, s, s === only ? 'changed' : state, changed)} AS ${q(s.alias)}`;
      if (i === 0) return rel;
      return `\n    ${s.joinType === 'left' ? 'LEFT JOIN' : 'JOIN'} ${rel} ON (${s.joinCondition})`;
    })
    .join('');
}

/**
 * The occurrences a join condition names (ADR 0074): `alias.column`, or a bare column name
 * one occurrence's shadow holds (a bare name is unambiguous, or the definition would not
 * have validated). String literals are left aside.
 */
function referenced(plan: TransformPlan, condition: string): Set<PlanSource> {
  const found = new Set<PlanSource>();
  const text = condition.replace(/'(?:[^']|'')*'/g, "''");
  const ident = `(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)`;
  const unquote = (x: string) =>
    x.startsWith('"') ? x.slice(1, -1).replace(/""/g, '"') : x.toLowerCase();
  const pattern = new RegExp(String.raw`(${ident})(?:\s*\.\s*(${ident}))?`, 'g');
  for (const m of text.matchAll(pattern)) {
    const start = m.index ?? 0;
    // Not a name's tail (`x.y` is read whole) nor a number's (`1e5`).
    if (start > 0 && /[A-Za-z0-9_$."]/.test(text[start - 1]!)) continue;
    if (m[2] !== undefined) {
      const alias = unquote(m[1]!);
      for (const s of plan.sources) if (s.alias === alias) found.add(s);
      continue;
    }
    const name = unquote(m[1]!);
    for (const s of plan.sources) {
      if (plan.shadow?.find((x) => x.ordinal === s.ordinal)?.columns.some((c) => c.name === name)) {
        found.add(s);
      }
    }
  }
  return found;
}

/**
 * A condition's terms ANDed at its top level (`a = b AND c = d`: two), so that each names
 * only the occurrences it needs; brackets, string literals, quoted names and `BETWEEN x AND
 * y` are kept whole. A term the split gets wrong only joins later than it could.
 */
function conjuncts(condition: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  let between = 0;
  const words = /'(?:[^']|'')*'|"(?:[^"]|"")*"|[()]|\b(?:and|between)\b/gi;
  for (const m of condition.matchAll(words)) {
    const token = m[0].toLowerCase();
    if (token === '(') depth++;
    else if (token === ')') depth--;
    else if (depth === 0 && token === 'between') between++;
    else if (depth === 0 && token === 'and') {
      if (between > 0) between--;
      else {
        terms.push(condition.slice(start, m.index));
        start = (m.index ?? 0) + m[0].length;
      }
    }
  }
  terms.push(condition.slice(start));
  const kept = terms.map((t) => t.trim()).filter((t) => t.length > 0);
  return kept.length ? kept : [condition];
}

/**
 * Over inner joins, the occurrences in the order a statement restricted to `first`'s
 * changed rows joins them (ADR 0074): `first`, then each time the first occurrence, in
 * FROM order, that a join condition connects to those already joined (every occurrence it
 * names joined, one of them before). Statements over the shadows are planned in the order
 * written (work-settings.ts, keepsWrittenJoinOrder), so the join grows from the changed
 * rows outward, through the shadows' indexes, and never joins two whole shadows first.
 * `upTo`: the occurrences joined (a prefix, in FROM order). Null with a LEFT JOIN among
 * them (its order is its meaning).
 */
function outwardOrder(plan: TransformPlan, first: PlanSource, upTo: number): PlanSource[] | null {
  const sources = plan.sources.slice(0, upTo);
  if (!sources.includes(first)) return null;
  if (sources.some((s) => s.joinType === 'left')) return null;
  const conditions = sources
    .filter((s) => s.joinCondition)
    .flatMap((s) => conjuncts(s.joinCondition!))
    .map((c) => referenced(plan, c));
  const order = [first];
  const placed = new Set<PlanSource>(order);
  while (order.length < sources.length) {
    const unplaced = sources.filter((s) => !placed.has(s));
    const next =
      unplaced.find((candidate) =>
        conditions.some(
          (names) =>
            names.has(candidate) &&
            [...names].some((n) => placed.has(n)) &&
            [...names].every((n) => n === candidate || placed.has(n)),
        ),
      ) ?? unplaced[0]!;
    order.push(next);
    placed.add(next);
  }
  return order;
}

/**
 * The definition's FROM over the relations `rel` gives each occurrence, joined from
 * `first`'s rows outward where the joins allow it (outwardOrder), else as written; with the
 * conditions to AND into WHERE (`conditions`, 'true' when they stay in the joins).
 */
function fromOutward(
  plan: TransformPlan,
  first: PlanSource,
  rel: (s: PlanSource, at: number) => string,
  upTo: number = plan.sources.length,
  /**
   * A condition on `first`'s columns (its alias, or bare names) that the statement's WHERE
   * also holds: when the join is reordered, it is applied to `first`'s rows before they are
   * joined. A restriction in WHERE written as `… IN (SELECT …)` is planned as a semi-join,
   * and with the join order kept that semi-join comes after the whole join.
   */
  restrict: string | null = null,
): { from: string; conditions: string } {
  const order = outwardOrder(plan, first, upTo);
  if (!order) {
    return {
      from: plan.sources
        .slice(0, upTo)
        .map((s, j) => {
          const r = `${rel(s, j)} AS ${q(s.alias)}`;
          // The FROM table is never NULL-extended (INNER and LEFT joins only): restricted
          // before its joins, it keeps the rows WHERE would.
          if (j === 0 && restrict && s === first) {
            return `(SELECT * FROM ${r} WHERE ${restrict}) AS ${q(s.alias)}`;
          }
          if (j === 0) return r;
          return `\n    ${s.joinType === 'left' ? 'LEFT JOIN' : 'JOIN'} ${r} ON (${s.joinCondition})`;
        })
        .join(''),
      conditions: 'true',
    };
  }
  return {
    from: order
      .map((s, j) => {
        const r = `${rel(s, plan.sources.indexOf(s))} AS ${q(s.alias)}`;
        if (j > 0) return `\n    CROSS JOIN ${r}`;
        return restrict ? `(SELECT * FROM ${r} WHERE ${restrict}) AS ${q(s.alias)}` : r;
      })
      .join(''),
    conditions:
      plan.sources
        .slice(0, upTo)
        .filter((s) => s.joinCondition)
        .map((s) => `(${s.joinCondition})`)
        .join(' AND ') || 'true',
  };
}

/** `where` with `conditions` (fromOutward's) before it, 'true' left out. */
function withConditions(conditions: string, where: string): string {
  return conditions === 'true' ? where : `${conditions} AND ${where}`;
}

/**
 * Kept by delta (ADR 0067): a join row's delta columns, each GROUP BY expression as
 * `"g<n>"` and each aggregate input as `"i<n>"` (as a join-row key map holds them, ADR 0044).
 */
function deltaColumns(plan: TransformPlan): string[] {
  return [
    ...plan.groups.map((g, i) => `(${g.expression}) AS ${q(`g${i + 1}`)}`),
    ...(plan.delta?.inputs ?? []).map((x, i) => `(${x.expr}) AS ${q(`i${i + 1}`)}`),
  ];
}

/**
 * Kept by delta: the join rows passing WHERE in a state ('before': the shadow as it is;
 * 'after': with the changed keys' rows replaced by the sources' current rows), as delta
 * columns (deltaColumns): what a self-check's repair folds its groups' states from
 * ('before'), and what a rescan folds again for the groups whose extreme a change removed
 * ('after').
 */
export function shadowJoinRows(
  plan: TransformPlan,
  state: 'before' | 'after',
  changed: ChangedSources = null,
): string {
  return `SELECT ${list(deltaColumns(plan))}
    FROM ${fromIn(plan, state, changed)}${plan.where ? `\n   WHERE (${plan.where})` : ''}`;
}

/**
 * A changed occurrence's rows as a signed difference: the shadow's rows of its changed
 * keys (the old ones, `"trellis#sign"` -1) and the source's current rows of those keys (+1).
 */
function signedRelation(plan: TransformPlan, source: PlanSource): string {
  const shadow = shadowOf(plan, source);
  const m = own('m');
  const s = own('s');
  return `(SELECT -1 AS ${own('sign')}, ${list(shadow.columns.map((c) => `${m}.${q(c.col)} AS ${q(c.name)}`))}
         FROM ${plan.mapSql} ${m}
        WHERE ${m}.o = ${source.ordinal} AND ${tuple(shadowKeys(plan, source, m))} IN (${changedOf(source)})
        UNION ALL
        SELECT 1, ${list(shadow.columns.map((c) => `${s}.${q(c.name)}`))} FROM ${source.table} ${s}
         WHERE ${tuple(source.keyColumns.map((k) => `${s}.${q(k)}`))} IN (${changedOf(source)}))`;
}

/**
 * Kept by delta (ADR 0067): the signed join rows a change makes (columns `sign`, then the
 * delta columns), by the delta rule of an inner join. For each changed occurrence _i_ in
 * FROM order, the join with _i_ read as the difference of its changed rows (signedRelation),
 * the occurrences before it in the state after the change and those after it in the state
 * before: Δ(R1 ⋈ … ⋈ Rn) = Σᵢ R1' ⋈ … ⋈ R(i-1)' ⋈ ΔRi ⋈ R(i+1) ⋈ … ⋈ Rn, so a join row of
 * rows changed in two occurrences is counted once. WHERE applies to each join row. Each
 * branch costs the join rows its changed rows make, never a group's other rows.
 */
export function shadowSignedRows(plan: TransformPlan, changed: ChangedSources): string {
  const occurrences = changedOccurrences(plan, changed);
  if (hasLeftJoin(plan) && occurrences.length > 0) return leftSignedRows(plan, changed);
  if (occurrences.length === 0) {
    return `SELECT ${list(['1 AS sign', ...deltaColumns(plan)])}
    FROM ${fromIn(plan, 'before')} WHERE false`;
  }
  return occurrences
    .map((occurrence) => {
      const at = plan.sources.indexOf(occurrence);
      const { from, conditions } = fromOutward(plan, occurrence, (s, j) =>
        s === occurrence
          ? signedRelation(plan, s)
          : relation(plan, s, j < at ? 'after' : 'before', changed),
      );
      const filter = [
        ...(conditions === 'true' ? [] : [conditions]),
        ...(plan.where ? [`(${plan.where})`] : []),
      ];
      return `SELECT ${list([`${q(occurrence.alias)}.${own('sign')} AS sign`, ...deltaColumns(plan)])}
    FROM ${from}${filter.length ? `\n   WHERE ${filter.join(' AND ')}` : ''}`;
    })
    .join('\n  UNION ALL\n  ');
}

/**
 * Kept by delta over a join with a LEFT JOIN (ADR 0067, addendum): the signed join rows of
 * the FROM rows the change touches (CTE `affected`, which the statement holds: see
 * shadowSignedCtes), as they were (the shadow, -1) and as they are (+1). Only INNER and
 * LEFT joins reach here, so a FROM row is never NULL-extended and the join is the disjoint
 * union of its FROM rows' join rows: the difference over the touched FROM rows is the whole
 * difference, a NULL-extended row included when its FROM row's matches empty or fill.
 * Each branch costs the touched FROM rows' join rows (through the shadow's indexes), not
 * their groups' other rows; where one changed row touches many FROM rows (a self-join on a
 * category), those are all re-joined.
 */
function leftSignedRows(plan: TransformPlan, changed: ChangedSources): string {
  const driving = plan.sources[0]!;
  const names = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const touchedRows = `${tuple(sourceKeys(driving))} IN (SELECT ${list(names)} FROM affected)`;
  return (['before', 'after'] as const)
    .map(
      (
        state,
      ) => `SELECT ${list([state === 'before' ? '-1 AS sign' : '1 AS sign', ...deltaColumns(plan)])}
    FROM ${fromIn(plan, state, changed)}
   WHERE ${restrictedWhere(touchedRows, plan.where)}`,
    )
    .join('\n  UNION ALL\n  ');
}

/**
 * Kept by delta: the CTEs of the signed join rows a change makes (`signed`, and `affected`
 * before it over a join with a LEFT JOIN), each ending with a comma.
 */
export function shadowSignedCtes(plan: TransformPlan, changed: ChangedSources): string {
  const occurrences = changedOccurrences(plan, changed);
  return `${hasLeftJoin(plan) && occurrences.length > 0 ? `${affectedCte(plan, changed)}\n` : ''}signed AS MATERIALIZED (
  ${shadowSignedRows(plan, changed)}
),`;
}

/**
 * Kept by delta: the join rows passing WHERE over the sources themselves, as delta columns
 * (what a build folds into the group states, in the statement filling the shadow).
 */
export function sourceJoinRows(plan: TransformPlan): string {
  return `SELECT ${list(deltaColumns(plan))}
    FROM ${plan.fromSql}${plan.where ? `\n   WHERE (${plan.where})` : ''}`;
}

/**
 * Kept by delta: CTEs writing the changed rows' current state into the shadow (see
 * shadowReplaced), and the count of rows they added.
 */
export function shadowReplacedCtes(
  plan: TransformPlan,
  changed: ChangedSources,
): { ctes: string; added: string } {
  const replaced = changedOccurrences(plan, changed);
  return {
    ctes: shadowReplaced(plan, changed),
    added: replaced.length
      ? replaced.map((s) => `(SELECT count(*) FROM shadow_added_${s.ordinal})`).join(' + ')
      : '0',
  };
}

/** The columns of the `groups` CTE: one per GROUP BY expression, the engine's names. */
function groupColumns(plan: TransformPlan): string[] {
  return plan.groups.map((_, i) => own(`g${i + 1}`));
}

function sourceKeys(source: PlanSource): string[] {
  return source.keyColumns.map((k) => col(source.alias, k));
}

const hasLeftJoin = (plan: TransformPlan) => plan.sources.some((s) => s.joinType === 'left');

/**
 * CTE `affected` (a join with a LEFT JOIN only): the FROM table's keys whose join rows the
 * changes may change, WHERE left aside. A LEFT JOIN's NULL-extended row holds none of the
 * rows whose coming or going made it: its FROM row is found through the row that did hold
 * one, in the other state. For each changed occurrence _i_ and state, the FROM rows of the
 * join of the occurrences up to _i_ (FROM order) that hold a changed row of _i_: the first
 * occurrence at which a FROM row's rows differ between the states holds a changed row in
 * one of them, whatever the joins after it do with it (an inner join after a LEFT JOIN can
 * drop the row that holds it, and keep the NULL-extended one).
 */
function affectedCte(plan: TransformPlan, changed: ChangedSources): string {
  const driving = plan.sources[0]!;
  const names = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const branches = (['before', 'after'] as State[]).flatMap((state) =>
    changedOccurrences(plan, changed).map((s) => {
      const restriction = `${tuple(sourceKeys(s))} IN (${changedOf(s)})`;
      const { from, conditions } = fromOutward(
        plan,
        s,
        (o) => relation(plan, o, state, changed),
        plan.sources.indexOf(s) + 1,
        restriction,
      );
      return `SELECT ${list(sourceKeys(driving).map((k, i) => `${k} AS ${names[i]}`))}
    FROM ${from}
   WHERE ${withConditions(conditions, restriction)}`;
    }),
  );
  const none = `SELECT ${list(driving.keyColumns.map((_, i) => `NULL::${driving.keyTypes[i]} AS ${names[i]}`))} WHERE false`;
  return `affected AS MATERIALIZED (
  ${branches.length ? branches.join('\n  UNION\n  ') : none}
),`;
}

/**
 * The groups (columns `groupColumns`) the changes touch: those of the join rows, passing
 * WHERE, that hold a changed row in the state before or after (with a LEFT JOIN, every
 * join row of an affected FROM row, in both states). Over inner joins, one branch per
 * changed occurrence: that occurrence read as both versions of its changed rows, every
 * other as the union of both states. Each join row of either state is one of those (its
 * rows are in the union, and its WHERE sees the same values), so no group is missed; a
 * join row mixing the states only adds a group, recomputed for nothing. Half the joins of
 * one per occurrence and state, and a source without changes has no branch.
 */
function touched(plan: TransformPlan, changed: ChangedSources): string[] {
  const named = groupColumns(plan);
  const select = list(plan.groups.map((g, i) => `(${g.expression}) AS ${named[i]}`));
  if (hasLeftJoin(plan)) {
    const driving = plan.sources[0]!;
    const names = driving.keyColumns.map((_, i) => `k${i + 1}`);
    return (['before', 'after'] as State[]).map(
      (state) => `SELECT ${select}
    FROM ${fromIn(plan, state, changed)}
   WHERE ${restrictedWhere(`${tuple(sourceKeys(driving))} IN (SELECT ${list(names)} FROM affected)`, plan.where)}`,
    );
  }
  // The restriction repeats what the occurrence's rows already are: it keeps WHERE from
  // being evaluated on rows of the other occurrences that join no changed row.
  return changedOccurrences(plan, changed).map((s) => {
    const { from, conditions } = fromOutward(plan, s, (o) =>
      relation(plan, o, o === s ? 'changed' : 'union', changed),
    );
    const restricted = restrictedWhere(`${tuple(sourceKeys(s))} IN (${changedOf(s)})`, plan.where);
    return `SELECT ${select}
    FROM ${from}
   WHERE ${withConditions(conditions, restricted)}`;
  });
}

/** The body of the `groups` CTE: the touched groups (none when no source changed). */
function touchedGroups(plan: TransformPlan, changed: ChangedSources): string {
  const branches = touched(plan, changed);
  if (branches.length) return branches.join('\n  UNION\n  ');
  const named = groupColumns(plan);
  return `SELECT ${list(plan.groups.map((g, i) => `NULL::${g.type} AS ${named[i]}`))} WHERE false`;
}

/**
 * The groups of the `groups` CTE, recomputed over `from`: those without a NULL through
 * `IN` (index-friendly), those with one through a null-safe match in a branch that runs
 * only when such a group is there. With HAVING, whether each passes (`"trellis#kept"`).
 */
function recomputed(
  plan: TransformPlan,
  /** The FROM, or the FROM for a restriction its first relation may take (fromOutward). */
  from: string | ((restriction: string) => string),
  conditions = 'true',
): string {
  const fromFor = (restriction: string) => (typeof from === 'string' ? from : from(restriction));
  const exprs = plan.groups.map((g) => `(${g.expression})`);
  const cols = groupColumns(plan);
  const select = list([
    selectList(plan),
    ...(plan.having ? [`coalesce((${plan.having}), false) AS ${own('kept')}`] : []),
  ]);
  const g = own('g');
  const anyNull = cols.map((c) => `${c} IS NULL`).join(' OR ');
  const inGroups = `${tuple(exprs)} IN (SELECT ${list(cols)} FROM groups)`;
  const inNullGroup = `EXISTS (
       SELECT 1 FROM groups ${g}
        WHERE (${cols.map((c) => `${g}.${c} IS NULL`).join(' OR ')})
          AND ${cols.map((c, i) => `${g}.${c} IS NOT DISTINCT FROM ${exprs[i]}`).join(' AND ')})`;
  return `SELECT ${select}
    FROM ${fromFor(inGroups)}
   WHERE ${withConditions(conditions, restrictedWhere(inGroups, plan.where))}
   GROUP BY ${list(plan.groupBy)}
  UNION ALL
  SELECT ${select}
    FROM ${fromFor(inNullGroup)}
   WHERE (SELECT coalesce(bool_or(${anyNull}), false) FROM groups)
     AND ${withConditions(conditions, restrictedWhere(inNullGroup, plan.where))}
   GROUP BY ${list(plan.groupBy)}`;
}

/**
 * The touched groups recomputed over the state after the changes: joined from the
 * occurrence the GROUP BY reads (when it reads one alone), outward (fromOutward), so the
 * join starts at the groups' rows through the shadow's index on the GROUP BY columns.
 */
function recomputedAfter(plan: TransformPlan, changed: ChangedSources): string {
  const read = new Set(plan.groups.flatMap((g) => [...referenced(plan, g.expression)]));
  const [first] = read;
  if (read.size !== 1 || !first) return recomputed(plan, fromIn(plan, 'after', changed));
  const rel = (o: PlanSource) => relation(plan, o, 'after', changed);
  const { conditions } = fromOutward(plan, first, rel);
  const from = (restriction: string) =>
    fromOutward(plan, first, rel, plan.sources.length, restriction).from;
  return recomputed(plan, from, conditions);
}

/**
 * CTEs writing the changed rows' current state into the shadow (one pair per occurrence
 * whose source may have changed).
 */
function shadowReplaced(plan: TransformPlan, changed: ChangedSources): string {
  return changedOccurrences(plan, changed)
    .map((source) => {
      const shadow = shadowOf(plan, source);
      const s = own('s');
      return `
shadow_removed_${source.ordinal} AS (
  DELETE FROM ${plan.mapSql} m
   WHERE m.o = ${source.ordinal} AND ${tuple(shadowKeys(plan, source, 'm'))} IN (${changedOf(source)})
  RETURNING 1
),
shadow_added_${source.ordinal} AS (
  INSERT INTO ${plan.mapSql} (o, ${list(shadow.columns.map((c) => q(c.col)))})
  SELECT ${source.ordinal}, ${list(shadow.columns.map((c) => `${s}.${q(c.name)}`))} FROM ${source.table} ${s}
   WHERE ${tuple(source.keyColumns.map((k) => `${s}.${q(k)}`))} IN (${changedOf(source)})
  RETURNING 1
),`;
    })
    .join('');
}

/** CTEs filling the (empty) shadow from the sources: one per occurrence (`shadow_<n>`). */
function shadowFilled(plan: TransformPlan): string {
  return plan.sources
    .map((source) => {
      const shadow = shadowOf(plan, source);
      const s = own('s');
      return `
shadow_${source.ordinal} AS (
  INSERT INTO ${plan.mapSql} (o, ${list(shadow.columns.map((c) => q(c.col)))})
  SELECT ${source.ordinal}, ${list(shadow.columns.map((c) => `${s}.${q(c.name)}`))} FROM ${source.table} ${s}
  RETURNING 1
),`;
    })
    .join('');
}

function shadowFilledCount(plan: TransformPlan): string {
  return plan.sources.map((s) => `(SELECT count(*) FROM shadow_${s.ordinal})`).join(' + ');
}

/** The tail every statement writing groups shares: upsert `derived`, delete `gone`. */
function written(plan: TransformPlan): string {
  return `upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
gone AS MATERIALIZED (
  SELECT ${list(groupColumns(plan).map((c, i) => `${c} AS ${q(plan.key[i]!)}`))} FROM groups
  EXCEPT
  SELECT ${list(plan.key.map((k) => `d.${q(k)}`))} FROM derived d
),
removed AS (
  DELETE FROM ${plan.targetSql} t USING gone g
   WHERE ${keyMatch(plan, 't', 'g')}
  RETURNING 1
)`;
}

const derivedCte = (plan: TransformPlan) => `derived AS MATERIALIZED (
  SELECT * FROM aggregated${plan.having ? ` WHERE ${own('kept')}` : ''}
),`;

/**
 * Re-derivation of a transform whose key map is a shadow, for the `changed` CTE
 * (`changedSql` its body). 'recompute': every group computed from the sources in one
 * pass and merged into the target, the shadow emptied and filled again from the sources
 * in the same snapshot (ADR 0029).
 */
export function shadowRederiveSql(
  plan: TransformPlan,
  changedSql: string,
  mode: ApplyMode = 'rederive',
  /** The sources the changes may be of (a superset), or null for all: see ChangedSources. */
  changed: ChangedSources = null,
): string {
  const named = groupColumns(plan);
  if (mode === 'recompute') {
    return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
groups AS MATERIALIZED (
  SELECT ${list(plan.key.map((k, i) => `t.${q(k)} AS ${named[i]}`))} FROM ${plan.targetSql} t
),
aggregated AS MATERIALIZED (
  SELECT ${list([selectList(plan), ...(plan.having ? [`coalesce((${plan.having}), false) AS ${own('kept')}`] : [])])}
    FROM ${plan.fromSql}${plan.where ? `\n   WHERE (${plan.where})` : ''}
   GROUP BY ${list(plan.groupBy)}
),
${derivedCte(plan)}
shadow_cleared AS (
  DELETE FROM ${plan.mapSql}
  RETURNING 1
),${shadowFilled(plan)}
${written(plan)}
SELECT (SELECT count(*) FROM changed)::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed,
       (SELECT count(*) FROM shadow_cleared)::int AS map_removed,
       (${shadowFilledCount(plan)})::int AS map_added`;
  }
  const replaced = changedOccurrences(plan, changed);
  const count = (cte: string) =>
    replaced.length
      ? replaced.map((s) => `(SELECT count(*) FROM ${cte}_${s.ordinal})`).join(' + ')
      : '0';
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),${hasLeftJoin(plan) ? `\n${affectedCte(plan, changed)}` : ''}
groups AS MATERIALIZED (
  ${touchedGroups(plan, changed)}
),
aggregated AS MATERIALIZED (
  ${recomputedAfter(plan, changed)}
),
${derivedCte(plan)}${shadowReplaced(plan, changed)}
${written(plan)}
SELECT (SELECT count(*) FROM (SELECT DISTINCT source_id, key FROM changed) c)::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed,
       (${count('shadow_removed')})::int AS map_removed,
       (${count('shadow_added')})::int AS map_added`;
}

/**
 * The groups (target keys, as text: column `k`) a set of changes re-derives, as
 * shadowRederiveSql finds them, narrowed by `filter` (a condition on the group columns,
 * or null): what the self-check asks (see affectedGroupsSql).
 */
export function shadowAffectedGroupsSql(
  plan: TransformPlan,
  changedSql: string,
  filter: (groupColumns: string[]) => string | null,
): string {
  const named = groupColumns(plan);
  const where = filter(named);
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),${hasLeftJoin(plan) ? `\n${affectedCte(plan, null)}` : ''}
groups AS MATERIALIZED (
  ${touchedGroups(plan, null)}
)
SELECT DISTINCT ARRAY[${list(named.map((c) => `${c}::text COLLATE "C"`))}]::text[] AS k
  FROM groups${where ? `\n WHERE ${where}` : ''}`;
}

/**
 * Recomputes the groups given as `$1` (a JSON array of text arrays, one per group key)
 * from the shadow as it is: what a self-check's repair runs after re-deriving the rows of
 * those groups (see shadowGroupRowsSql), for a group the target holds and no row is in.
 */
export function shadowRegroupSql(plan: TransformPlan): string {
  const named = groupColumns(plan);
  const typed = plan.groups.map((g, i) => `(e->>${i})::${g.type} AS ${named[i]}`);
  return `WITH groups AS MATERIALIZED (
  SELECT ${list(typed)} FROM jsonb_array_elements($1::jsonb) e
),
aggregated AS MATERIALIZED (
  ${recomputed(plan, fromIn(plan, 'before'))}
),
${derivedCte(plan)}
${written(plan)}
SELECT (SELECT count(*) FROM upserted)::int AS upserted, (SELECT count(*) FROM removed)::int AS removed`;
}

/**
 * Every source row (`s` its source id, `k` its key as text) in the groups `inGroups`
 * selects (given the group expressions), in the sources now and in the shadow: what a
 * self-check's repair re-derives for groups it found diverged.
 */
export function shadowGroupRowsSql(
  plan: TransformPlan,
  inGroups: (items: string[]) => string,
): string {
  const exprs = plan.groups.map((g) => `(${g.expression})`);
  const sources = requireSourceIds(plan);
  const branches = [plan.fromSql, fromIn(plan, 'before')].flatMap((from) =>
    sources.map(
      (s) => `SELECT ${s.sourceId} AS s, ARRAY[${list(sourceKeys(s).map((k) => `${k}::text`))}] AS k
    FROM ${from}
   WHERE ${restrictedWhere(inGroups(exprs), plan.where)} AND ${sourceKeys(s)[0]} IS NOT NULL`,
    ),
  );
  return `SELECT DISTINCT s, k FROM (
  ${branches.join('\n  UNION ALL\n  ')}) x`;
}

/**
 * Build (stage 'groups') of a transform whose key map is a shadow: the shadow filled from
 * the sources and every group computed from them, in one statement (one snapshot: the
 * target is the definition over the shadow). Returns the shadow's rows as `rows`.
 */
export function shadowFillSql(plan: TransformPlan, fill: string): string {
  return `WITH ${shadowFilled(plan).replace(/^\n/, '')}
filled AS (
  ${fill}
  RETURNING 1
)
SELECT (${shadowFilledCount(plan)})::int AS rows, (SELECT count(*) FROM filled)::int AS groups`;
}
