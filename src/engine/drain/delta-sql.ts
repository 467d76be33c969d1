import { affectedDrivingKeys, mapGroup, mapKeys, mapRows } from './aggregate-sql.js';
import {
  type DeltaAggregate,
  type DeltaPlan,
  mayRescan,
  type StatePart,
  stateParts,
  tracksScale,
} from './delta-plan.js';
import type { TransformPlan } from './plan.js';
import {
  type ChangedSources,
  shadowFillSql,
  shadowJoinRows,
  shadowReplacedCtes,
  shadowSignedCtes,
  sourceJoinRows,
} from './shadow-sql.js';
import { list, own, q, requireSourceIds, tuple, upsert, writtenColumns } from './sql-parts.js';

/**
 * Aggregates kept by delta (ADR 0044). A changed driving key's key-map rows hold each join
 * row's group and aggregate inputs as they were counted: its old contribution. The
 * statement replaces them with the rows as they are now, and applies the difference, row
 * by row signed (-1 for an old row, +1 for a new one), to the states of the groups they
 * fall in (`<schema>.groups_<id>`); the target rows of those groups are then computed from
 * their states. It reads the changed rows, the key-map rows of their driving keys and the
 * states of their groups — never the groups' other rows, except for a rescan: a change
 * that removes a group's extreme (min, max, the largest numeric scale) reads that group's
 * key-map rows again for it.
 *
 * The invariant that makes this exact: a group's state is always its key-map rows folded,
 * and the target row its state finalised. Every statement here changes the key map, the
 * states and the target together. A row is counted as the key map records it, so
 * re-deriving a key twice, or after a later change was already read, still leaves
 * state = fold(map) (I3, I9): the map's rows are what is subtracted next time.
 *
 * A transform's delta ranges are applied one at a time (ranges.ts keeps them to one
 * bucket): states are computed from the states the statement reads, so two statements on
 * one group at once would lose one's change.
 */

const g = (i: number) => q(`g${i + 1}`);
const input = (k: number) => q(`i${k}`);
const part = (a: DeltaAggregate, p: StatePart) => q(`a${a.n}_${p}`);
const w = (name: string) => own(name);

function delta(plan: TransformPlan): DeltaPlan {
  if (!plan.delta) throw new Error(`transform ${plan.target} is not kept by delta`);
  return plan.delta;
}

/** The group columns of the key map and the state table (g1..gn). */
function groupCols(plan: TransformPlan): string[] {
  return plan.groups.map((_, i) => g(i));
}

/** Every column of the state table: groups, n, each aggregate's parts. */
function stateColumns(plan: TransformPlan): Array<{ name: string; type: string }> {
  return [
    ...plan.groups.map((grp, i) => ({ name: g(i), type: grp.type })),
    { name: 'n', type: 'bigint' },
    ...delta(plan).aggregates.flatMap((a) =>
      stateParts(a).map((p) => ({ name: part(a, p.part), type: p.type })),
    ),
  ];
}

/** `GROUP BY` for the groups (a grand total is one group: `GROUP BY ()`). */
function groupBy(cols: string[]): string {
  return cols.length ? `GROUP BY ${list(cols)}` : 'GROUP BY ()';
}

/** `PARTITION BY` for the groups (empty for a grand total). */
function partitionBy(cols: string[]): string {
  return cols.length ? `PARTITION BY ${list(cols)}` : '';
}

/**
 * Rows (with columns g1..gn and i1..im, every one counted once) aggregated into full
 * states: one expression per state column (not the groups), in stateColumns order. A
 * tracked scale counts the rows at the group's largest scale through the window column
 * `"trellis#ms<n>"` the rows carry (see withScaleWindows).
 */
function foldRows(plan: TransformPlan): string[] {
  return [
    'count(*) AS n',
    ...delta(plan).aggregates.flatMap((a) => {
      const x = a.input === null ? null : input(a.input);
      return stateParts(a).map(({ part: p }) => `${foldPart(a, p, x)} AS ${part(a, p)}`);
    }),
  ];
}

function foldPart(a: DeltaAggregate, p: StatePart, x: string | null): string {
  if (p === 'c') {
    if (a.kind === 'count') return x === null ? 'count(*)' : `count(*) FILTER (WHERE ${x})`;
    return `count(${x})`;
  }
  if (p === 's') {
    if (a.kind === 'sum_int') return `coalesce(sum(${x}), 0)::bigint`;
    if (a.kind === 'sum_int8' || a.kind === 'avg_int') return `coalesce(sum(${x}::numeric), 0)`;
    return `coalesce(sum(${x}) FILTER (WHERE scale(${x}) IS NOT NULL), 0)`;
  }
  if (p === 'nan') return `count(*) FILTER (WHERE ${x} = 'NaN')`;
  if (p === 'pinf') return `count(*) FILTER (WHERE ${x} = 'Infinity')`;
  if (p === 'ninf') return `count(*) FILTER (WHERE ${x} = '-Infinity')`;
  if (p === 'ms') return `max(scale(${x}))`;
  if (p === 'msc') return `count(*) FILTER (WHERE scale(${x}) = ${w(`ms${a.n}`)})`;
  if (p === 'm') return a.kind === 'min' ? `min(${x})` : `max(${x})`;
  // 'b': false inputs for bool_and, true ones for bool_or.
  return a.kind === 'bool_and'
    ? `count(*) FILTER (WHERE NOT ${x})`
    : `count(*) FILTER (WHERE ${x})`;
}

/** `rows` (an alias or subquery) with the window columns foldRows needs for tracked scales. */
function withScaleWindows(plan: TransformPlan, rows: string): string {
  const tracked = delta(plan).aggregates.filter(tracksScale);
  if (tracked.length === 0) return rows;
  const windows = tracked.map(
    (a) =>
      `max(scale(${input(a.input!)})) OVER (${partitionBy(groupCols(plan))}) AS ${w(`ms${a.n}`)}`,
  );
  return `(SELECT r.*, ${list(windows)} FROM ${rows} r)`;
}

/** The finalised result of each aggregate, from state columns of alias `x`, typed. */
function finalised(a: DeltaAggregate, x: string): string {
  const c = `${x}.${part(a, 'c')}`;
  const s = `${x}.${part(a, 's')}`;
  const special = () => {
    const nan = `${x}.${part(a, 'nan')}`;
    const pinf = `${x}.${part(a, 'pinf')}`;
    const ninf = `${x}.${part(a, 'ninf')}`;
    const scale = a.scale === null ? `${x}.${part(a, 'ms')}` : String(a.scale);
    const finite =
      a.kind === 'sum_numeric' ? `round(${s}, ${scale})` : `round(${s}, ${scale}) / ${c}::numeric`;
    return `CASE WHEN ${c} = 0 THEN NULL
             WHEN ${nan} > 0 OR (${pinf} > 0 AND ${ninf} > 0) THEN 'NaN'::numeric
             WHEN ${pinf} > 0 THEN 'Infinity'::numeric WHEN ${ninf} > 0 THEN '-Infinity'::numeric
             ELSE ${finite} END`;
  };
  const body = (() => {
    switch (a.kind) {
      case 'count':
        return c;
      case 'sum_int':
      case 'sum_int8':
        return `CASE WHEN ${c} > 0 THEN ${s} END`;
      case 'avg_int':
        return `CASE WHEN ${c} > 0 THEN ${s} / ${c}::numeric END`;
      case 'sum_numeric':
      case 'avg_numeric':
        return special();
      case 'min':
      case 'max':
        return `${x}.${part(a, 'm')}`;
      case 'bool_and':
        return `CASE WHEN ${c} > 0 THEN ${x}.${part(a, 'b')} = 0 END`;
      case 'bool_or':
        return `CASE WHEN ${c} > 0 THEN ${x}.${part(a, 'b')} > 0 END`;
    }
  })();
  return `(${body})::${a.type}`;
}

/**
 * Target rows from group states (alias `x` over `from`, with `condition` on the states):
 * the key columns from the groups, each other column from its expression over the
 * aggregates' results (evaluated in a subquery whose columns are the `"trellis#a<n>"` the
 * expressions name), kept where HAVING holds. Only written columns (paused ones are left).
 */
function targetRows(plan: TransformPlan, from: string, condition: string | null): string {
  const d = delta(plan);
  const keyNames = new Map(plan.key.map((k, i) => [k, i]));
  const inner = [
    ...plan.groups.map((_, i) => `x.${g(i)} AS ${w(`g${i + 1}`)}`),
    ...d.aggregates.map((a) => `${finalised(a, 'x')} AS ${w(`a${a.n}`)}`),
  ];
  const outer = writtenColumns(plan).map((c) => {
    const k = keyNames.get(c.name);
    if (k !== undefined) return `${w(`g${k + 1}`)} AS ${q(c.name)}`;
    const expr = d.items[c.name];
    if (expr === undefined) throw new Error(`no delta expression for ${plan.target}.${c.name}`);
    return `${expr} AS ${q(c.name)}`;
  });
  return `SELECT ${list(outer)}
    FROM (SELECT ${list(inner)} FROM ${from} x${condition ? ` WHERE ${condition}` : ''}) ${w('s')}${
      d.having ? `\n   WHERE coalesce((${d.having}), false)` : ''
    }`;
}

/**
 * CTE `removed`: target rows of the groups in `final` that `derived` no longer has (emptied,
 * or out of HAVING); a grand total's one row only when HAVING leaves it out.
 */
function removedSql(plan: TransformPlan): string {
  if (plan.groups.length === 0) {
    return `removed AS (
  DELETE FROM ${plan.targetSql} t WHERE NOT EXISTS (SELECT 1 FROM derived)
  RETURNING 1
)`;
  }
  return `gone AS MATERIALIZED (
  SELECT ${list(plan.key.map((k, i) => `${g(i)} AS ${q(k)}`))} FROM final
  EXCEPT
  SELECT ${list(plan.key.map((k) => `dd.${q(k)}`))} FROM derived dd
),
${nullSafeDelete('removed', plan.targetSql, plan.key.map(q), 'gone', plan.key.map(q))}`;
}

/** Key-map columns, in the map's order: every source's key, the groups, passes, the inputs. */
function mapColumns(plan: TransformPlan): string[] {
  return [
    ...plan.sources.flatMap((s) => mapKeys(s)),
    ...plan.groups.map((_, i) => mapGroup(i + 1)),
    'passes',
    ...delta(plan).inputs.map((_, i) => input(i + 1)),
  ];
}

/**
 * Rows of `table` (alias `t`) whose columns `cols` (qualified by `t`) match a row of CTE
 * `cte` (columns `cteCols`), null-safe: a plain `IN` for values without a NULL (hashable,
 * index-friendly), and a second branch for those with one, behind a one-time filter so it
 * runs only when the CTE holds such a row. `select` is what each branch selects, `extra`
 * a further condition on `t`. (A null-safe join condition, `IS NOT DISTINCT FROM` or an
 * OR, would be a nested loop over the whole table.) A grand total (no columns) matches
 * every row when the CTE has one.
 */
function nullSafeMatch(
  select: string,
  table: string,
  cols: string[],
  cte: string,
  cteCols: string[],
  extra: string | null = null,
): string {
  const and = extra ? ` AND ${extra}` : '';
  if (cols.length === 0) {
    return `SELECT ${select} FROM ${table} WHERE EXISTS (SELECT 1 FROM ${cte})${and}`;
  }
  const x = own('x');
  const anyNull = (alias: string) => cteCols.map((c) => `${alias}${c} IS NULL`).join(' OR ');
  return `SELECT ${select} FROM ${table}
   WHERE ${tuple(cols)} IN (SELECT ${list(cteCols)} FROM ${cte})${and}
  UNION ALL
  SELECT ${select} FROM ${table}
   WHERE (SELECT coalesce(bool_or(${anyNull('')}), false) FROM ${cte})
     AND EXISTS (SELECT 1 FROM ${cte} ${x}
                  WHERE (${anyNull(`${x}.`)})
                    AND ${cteCols.map((c, i) => `${x}.${c} IS NOT DISTINCT FROM ${cols[i]}`).join(' AND ')})${and}`;
}

/**
 * Two CTEs deleting the rows of `table` whose `cols` match a row of `cte` (null-safe, as
 * nullSafeMatch): `<name>` for values without a NULL, `<name>_null` for the rest.
 */
function nullSafeDelete(
  name: string,
  table: string,
  cols: string[],
  cte: string,
  cteCols: string[],
): string {
  const x = own('x');
  const anyNull = (alias: string) => cteCols.map((c) => `${alias}${c} IS NULL`).join(' OR ');
  return `${name} AS (
  DELETE FROM ${table} t WHERE ${tuple(cols.map((c) => `t.${c}`))} IN (SELECT ${list(cteCols)} FROM ${cte})
  RETURNING 1
),
${name}_null AS (
  DELETE FROM ${table} t
   WHERE (SELECT coalesce(bool_or(${anyNull('')}), false) FROM ${cte})
     AND EXISTS (SELECT 1 FROM ${cte} ${x}
                  WHERE (${anyNull(`${x}.`)})
                    AND ${cteCols.map((c, i) => `${x}.${c} IS NOT DISTINCT FROM t.${cols[i]}`).join(' AND ')})
  RETURNING 1
)`;
}

/**
 * The statement that applies a set of changes by delta (see the file's comment). Over the
 * CTE `changed` (`changedSql` its body), like every re-derivation (rederive-sql.ts); returns
 * keys, upserted, removed.
 */
export function deltaApplySql(
  plan: TransformPlan,
  changedSql: string,
  /** A shadow's changed sources (a superset; null for all): see ChangedSources. */
  changed: ChangedSources = null,
): string {
  const d = delta(plan);
  const mapSql = plan.mapSql!;
  const shadow = plan.mapKind === 'shadow';
  const driving = requireSourceIds(plan)[0]!;
  const affectedCols = driving.keyColumns.map((_, i) => `k${i + 1}`);
  const drivingInMap = tuple(mapKeys(driving, 'm'));
  const gcols = groupCols(plan);
  const inputs = d.inputs.map((_, i) => input(i + 1));
  const inputTypes = d.inputs.map((i) =>
    i.collation ? `${i.type} COLLATE ${i.collation}` : i.type,
  );
  const states = stateColumns(plan).filter((c) => !gcols.includes(c.name));
  const rescans = d.aggregates.filter(mayRescan);
  const grandTotal = gcols.length === 0;

  // Signed rows and the touched groups' current states, in one set: grouping it folds
  // each group's changes into its state (GROUP BY matches NULL groups, hashable).
  const signedCols = ['sign', ...gcols, ...inputs];
  const combined = `SELECT ${list([...signedCols, ...states.map((c) => `NULL::${c.type} AS ${c.name}`)])} FROM signed
  UNION ALL
  SELECT ${list([
    '0',
    ...gcols.map((c) => `st.${c}`),
    ...inputs.map((c, i) => `NULL::${inputTypes[i]} AS ${c}`),
    ...states.map((c) => `st.${c.name}`),
  ])} FROM current_states st`;
  // Per row, what the group's current state and added rows are (for extremes and scales).
  const windows = d.aggregates.flatMap((a) => {
    const x = a.input === null ? null : input(a.input);
    if (a.kind === 'min' || a.kind === 'max') {
      return [`max(${part(a, 'm')}) OVER grp AS ${w(`cur_m${a.n}`)}`];
    }
    if (tracksScale(a)) {
      return [
        `max(${part(a, 'ms')}) OVER grp AS ${w(`cur_ms${a.n}`)}`,
        `max(scale(${x})) FILTER (WHERE sign = 1) OVER grp AS ${w(`add_ms${a.n}`)}`,
      ];
    }
    return [];
  });
  const windowed = windows.length
    ? `SELECT c.*, ${list(windows)} FROM (${combined}) c WINDOW grp AS (${partitionBy(gcols)})`
    : combined;

  // Each group's new state (before rescans), and what it needs: per aggregate, what the
  // changes add (`sign` +1 rows), remove (-1), and the current state (the 0 row).
  const newN = 'coalesce(max(n), 0) + coalesce(sum(sign), 0)';
  const folded: string[] = [...gcols, `${newN} AS n`, `bool_or(sign = 0) AS existed`];
  const flags: string[] = [];
  for (const a of d.aggregates) {
    const x = a.input === null ? null : input(a.input);
    const cur = (p: StatePart) => `max(${part(a, p)})`;
    const add = (expr: string, p: StatePart) =>
      `coalesce(${cur(p)}, 0) + coalesce(${expr}, 0) AS ${part(a, p)}`;
    for (const { part: p } of stateParts(a)) {
      if (p === 'c') {
        const counted = a.kind === 'count' ? (x === null ? 'sign <> 0' : x) : `${x} IS NOT NULL`;
        folded.push(add(`sum(sign) FILTER (WHERE ${counted})`, 'c'));
      } else if (p === 's') {
        if (a.kind === 'sum_int') folded.push(add(`sum(sign::bigint * ${x})::bigint`, 's'));
        else if (a.kind === 'sum_int8' || a.kind === 'avg_int')
          folded.push(add(`sum(sign * ${x}::numeric)`, 's'));
        else folded.push(add(`sum(sign * ${x}) FILTER (WHERE scale(${x}) IS NOT NULL)`, 's'));
      } else if (p === 'nan' || p === 'pinf' || p === 'ninf') {
        const value = { nan: 'NaN', pinf: 'Infinity', ninf: '-Infinity' }[p];
        folded.push(add(`sum(sign) FILTER (WHERE ${x} = '${value}')`, p));
      } else if (p === 'ms') {
        folded.push(
          `${cur('ms')} AS ${w(`cur_ms${a.n}`)}`,
          `${cur('msc')} AS ${w(`cur_msc${a.n}`)}`,
          `max(${w(`add_ms${a.n}`)}) AS ${w(`add_ms${a.n}`)}`,
          `count(*) FILTER (WHERE sign = 1 AND scale(${x}) = ${w(`add_ms${a.n}`)}) AS ${w(`add_msc${a.n}`)}`,
          `count(*) FILTER (WHERE sign = -1 AND scale(${x}) = ${w(`cur_ms${a.n}`)}) AS ${w(`rm_msc${a.n}`)}`,
        );
      } else if (p === 'm') {
        const pick = a.kind === 'min' ? 'least' : 'greatest';
        const added = a.kind === 'min' ? `min(${x})` : `max(${x})`;
        const removesExtreme =
          a.kind === 'min' ? `${x} <= ${w(`cur_m${a.n}`)}` : `${x} >= ${w(`cur_m${a.n}`)}`;
        // An emptied group (a grand total's stays) has no extreme left.
        folded.push(
          `CASE WHEN ${newN} > 0 THEN ${pick}(${cur('m')}, ${added} FILTER (WHERE sign = 1)) END AS ${part(a, 'm')}`,
        );
        folded.push(
          `coalesce(bool_or(${removesExtreme}) FILTER (WHERE sign = -1), false) AS ${w(`hit${a.n}`)}`,
        );
        flags.push(w(`hit${a.n}`));
      } else if (p === 'b') {
        folded.push(add(`sum(sign) FILTER (WHERE ${a.kind === 'bool_and' ? `NOT ${x}` : x})`, 'b'));
      }
    }
  }
  // Tracked scales: the largest scale and how many inputs have it, from the fold's parts.
  const merged: string[] = ['f.*'];
  for (const a of d.aggregates.filter(tracksScale)) {
    const finite = `(f.${part(a, 'c')} - f.${part(a, 'nan')} - f.${part(a, 'pinf')} - f.${part(a, 'ninf')})`;
    const cur = `f.${w(`cur_ms${a.n}`)}`;
    const added = `f.${w(`add_ms${a.n}`)}`;
    const count = `CASE WHEN ${added} > coalesce(${cur}, -1) THEN f.${w(`add_msc${a.n}`)}
         ELSE coalesce(f.${w(`cur_msc${a.n}`)}, 0) - f.${w(`rm_msc${a.n}`)}
              + CASE WHEN ${added} = ${cur} THEN f.${w(`add_msc${a.n}`)} ELSE 0 END END`;
    merged.push(
      `CASE WHEN ${finite} = 0 THEN NULL WHEN ${added} > coalesce(${cur}, -1) THEN ${added} ELSE ${cur} END AS ${part(a, 'ms')}`,
      `CASE WHEN ${finite} = 0 THEN 0 ELSE ${count} END AS ${part(a, 'msc')}`,
    );
    flags.push(`(${finite} > 0 AND (${count}) <= 0)`);
  }
  const rescan = flags.length
    ? `(f.n > 0 AND (${flags.map((f) => (f.startsWith('"') ? `f.${f}` : f)).join(' OR ')}))`
    : 'false';
  merged.push(`${rescan} AS ${w('rescan')}`);

  // Groups whose extreme (or largest scale) was removed: read again from their rows after
  // the change (the key map's, less the affected keys' old rows, plus their new rows).
  // Every new row is folded (there are only as many as changed), and `final` takes the
  // result for the flagged groups only: matching two CTEs row by row would be a nested
  // loop, their row estimates being what they are.
  const rescanSql = rescans.length
    ? `
rescan_groups AS MATERIALIZED (
  SELECT ${gcols.length ? list(gcols) : '1'} FROM merged WHERE ${w('rescan')}
),
rescanned AS MATERIALIZED (
  SELECT ${list([...gcols, ...rescans.flatMap((a) => rescanParts(a))])}
    FROM ${withScaleWindows(
      plan,
      shadow
        ? // Over a shadow, from the join in the state after the change (ADR 0067).
          `(${nullSafeMatch(
            list([...gcols.map((c) => `m.${c}`), ...inputs.map((c) => `m.${c}`)]),
            `(${shadowJoinRows(plan, 'after', changed)}) m`,
            gcols.map((c) => `m.${c}`),
            'rescan_groups',
            gcols,
            // A one-time filter: without groups to rescan (most changes) the join is not
            // run at all, whatever plan its estimates give it.
            'EXISTS (SELECT 1 FROM rescan_groups)',
          )})`
        : `(${nullSafeMatch(
            list([...gcols.map((c) => `m.${c}`), ...inputs.map((c) => `m.${c}`)]),
            `${mapSql} m`,
            gcols.map((c) => `m.${c}`),
            'rescan_groups',
            gcols.length ? gcols : [],
            `m.passes AND ${drivingInMap} NOT IN (SELECT ${list(affectedCols)} FROM affected)`,
          )}
        UNION ALL
        SELECT ${list([...gcols.map((c) => `nr.${c}`), ...inputs.map((c) => `nr.${c}`)])}
          FROM new_rows nr WHERE nr.passes)`,
    )} rows
   ${groupBy(gcols)}${grandTotal ? '\n  HAVING EXISTS (SELECT 1 FROM rescan_groups)' : ''}
),
final AS MATERIALIZED (
  SELECT ${list([
    ...gcols,
    'max(n) AS n',
    'bool_or(existed) AS existed',
    ...states
      .filter((c) => c.name !== 'n')
      .map((c) =>
        rescanned(c.name)
          ? `CASE WHEN bool_or(src = 'm' AND ${w('rescan')}) THEN max(${c.name}) FILTER (WHERE src = 'r') ELSE max(${c.name}) FILTER (WHERE src = 'm') END AS ${c.name}`
          : `max(${c.name}) AS ${c.name}`,
      ),
  ])}
    FROM (SELECT 'm' AS src, ${list([...gcols, 'n', 'existed', w('rescan'), ...states.filter((c) => c.name !== 'n').map((c) => c.name)])} FROM merged
          UNION ALL
          SELECT 'r', ${list([
            ...gcols.map((c) => `r.${c}`),
            'NULL::bigint',
            'NULL::boolean',
            'NULL::boolean',
            ...states
              .filter((c) => c.name !== 'n')
              .map((c) => (rescanned(c.name) ? `r.${c.name}` : `NULL::${c.type}`)),
          ])} FROM rescanned r) x
   ${groupBy(gcols)}
),`
    : `
final AS MATERIALIZED (SELECT * FROM merged),`;

  function rescanned(name: string): boolean {
    return rescans.some((a) => [part(a, 'm'), part(a, 'ms'), part(a, 'msc')].includes(name));
  }
  function rescanParts(a: DeltaAggregate): string[] {
    const x = input(a.input!);
    if (a.kind === 'min' || a.kind === 'max') return [`${foldPart(a, 'm', x)} AS ${part(a, 'm')}`];
    return [
      `${foldPart(a, 'ms', x)} AS ${part(a, 'ms')}`,
      `${foldPart(a, 'msc', x)} AS ${part(a, 'msc')}`,
    ];
  }

  const stateNames = states.map((c) => c.name);
  const writtenStates = [...gcols, ...stateNames];
  const conflict = gcols.length ? `ON CONFLICT (${list(gcols)})` : 'ON CONFLICT ((true))';
  const replaced = shadow ? shadowReplacedCtes(plan, changed) : null;
  // Over a shadow (ADR 0067): the join rows a change makes, signed by the delta rule of a
  // join, and the changed rows written into the shadow. Otherwise: the affected driving
  // keys' key-map rows replaced, the old ones signed -1 and the new ones +1.
  const head = replaced
    ? `WITH changed AS MATERIALIZED (
  ${changedSql}
),
${shadowSignedCtes(plan, changed)}${replaced.ctes}`
    : `WITH changed AS MATERIALIZED (
  ${changedSql}
),
affected AS MATERIALIZED (
     ${affectedDrivingKeys(plan, mapSql)}
),
old_rows AS MATERIALIZED (
  DELETE FROM ${mapSql} m WHERE ${drivingInMap} IN (SELECT ${list(affectedCols)} FROM affected)
  RETURNING ${list([...gcols.map((c) => `m.${c}`), 'm.passes', ...inputs.map((c) => `m.${c}`)])}
),
new_rows AS MATERIALIZED (
  ${mapRows(plan, `${tuple(driving.keyColumns.map((k) => `${q(driving.alias)}.${q(k)}`))} IN (SELECT ${list(affectedCols)} FROM affected)`)}
),
map_added AS (
  INSERT INTO ${mapSql} (${list(mapColumns(plan))}) SELECT ${list(mapColumns(plan))} FROM new_rows
  RETURNING 1
),
signed AS MATERIALIZED (
  SELECT ${list(['-1 AS sign', ...gcols, ...inputs])} FROM old_rows WHERE passes
  UNION ALL
  SELECT ${list(['1', ...gcols, ...inputs])} FROM new_rows WHERE passes
),`;
  const keys = replaced
    ? '(SELECT count(*) FROM (SELECT DISTINCT source_id, key FROM changed) c)'
    : '(SELECT count(*) FROM affected)';
  const mapAdded = replaced ? `(${replaced.added})` : '(SELECT count(*) FROM map_added)';
  return `${head}
touched AS MATERIALIZED (
  SELECT DISTINCT ${gcols.length ? list(gcols) : '1 AS one'} FROM signed
),
current_states AS MATERIALIZED (
  ${
    grandTotal
      ? `SELECT st.* FROM ${d.statesSql} st`
      : nullSafeMatch(
          'st.*',
          `${d.statesSql} st`,
          gcols.map((c) => `st.${c}`),
          'touched',
          gcols,
        )
  }
),
folded AS MATERIALIZED (
  SELECT ${list(folded)}
    FROM (${windowed}) c
   ${groupBy(gcols)}
),
merged AS MATERIALIZED (
  SELECT ${list(merged)} FROM folded f
),${rescanSql}
states_written AS (
  INSERT INTO ${d.statesSql} AS st (${list(writtenStates)})
  SELECT ${list(writtenStates)} FROM final${grandTotal ? '' : ' WHERE n > 0'}
  ${conflict} DO UPDATE SET ${list(stateNames.map((c) => `${c} = EXCLUDED.${c}`))}
  RETURNING 1
),${
    grandTotal
      ? ''
      : `
emptied AS MATERIALIZED (
  SELECT ${list(gcols)} FROM final WHERE n = 0 AND existed
),
${nullSafeDelete('states_removed', d.statesSql, gcols, 'emptied', gcols)},`
  }
derived AS MATERIALIZED (
  ${targetRows(plan, 'final', grandTotal ? null : 'x.n > 0')}
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
${removedSql(plan)}
SELECT ${keys}::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed,
       (SELECT count(*) FROM states_written)::int AS states_written,
       ${mapAdded}::int AS map_added,
       (SELECT count(*) FROM signed)::int AS signed`;
}

/**
 * Build of a transform kept by delta (stage 'groups'), as three statements run in order in
 * one transaction: the key map filled from the sources (the only one to read them: one
 * snapshot), every group's state folded from the key map just written, and the target
 * computed from the states. State = fold(map) and target = finalised states hold by
 * construction, whatever the sources did between the statements; the first statement's
 * row count is the join rows mapped. Three statements rather than one with RETURNING
 * CTEs: a data-modifying CTE's rows are kept in a tuple store (spilled to disk past
 * work_mem) and read again, where the key map, written and still in shared buffers, is read
 * once by a plain scan (ADR 0050). Over a shadow, two (see below). The last statement fills
 * the target; the others are what a recompute runs again (deltaRefillStatements).
 */
export function deltaFillStatements(plan: TransformPlan): string[] {
  const d = delta(plan);
  const gcols = groupCols(plan);
  const states = stateColumns(plan);
  const written = writtenColumns(plan);
  const foldInto = (
    rows: string,
  ) => `INSERT INTO ${d.statesSql} (${list(states.map((c) => c.name))})
  SELECT ${list([...gcols, ...foldRows(plan)])}
    FROM ${withScaleWindows(plan, rows)} rows
   ${groupBy(gcols)}`;
  const target = `INSERT INTO ${plan.targetSql} (${list(written.map((c) => q(c.name)))})
  ${targetRows(plan, d.statesSql, gcols.length ? 'x.n > 0' : null)}`;
  if (plan.mapKind === 'shadow') {
    // Over a shadow (ADR 0067): the shadow filled and the states folded from the join over
    // the sources in one statement (one snapshot: the states are the join over the shadow
    // folded), through the sources' indexes — the shadow just written has neither its
    // indexes (deferred by the build) nor statistics. It returns the shadow's rows (`rows`).
    return [shadowFillSql(plan, foldInto(`(${sourceJoinRows(plan)})`)), target];
  }
  return [
    `INSERT INTO ${plan.mapSql} (${list(mapColumns(plan))})
  ${mapRows(plan, null)}`,
    foldInto(`(SELECT * FROM ${plan.mapSql} WHERE passes)`),
    target,
  ];
}

/**
 * Every group recomputed for a range of changes too big for deltas (apply-choice.ts): the
 * key map and group states, emptied by the caller (TRUNCATE, in the same transaction),
 * are filled again from the sources by deltaRefillStatements, then this statement merges
 * the target with what the states give — rows that differ written, groups gone deleted —
 * so readers see it before or after, never half (ADR 0029). Over the `changed` CTE like
 * every re-derivation, which it only counts. The fills are statements of their own, as in
 * a build (ADR 0050, ADR 0061): through data-modifying CTEs every key-map row was kept in
 * a tuple store (spilled past work_mem) and read again, and every state row too.
 */
export function deltaRecomputeSql(plan: TransformPlan, changedSql: string): string {
  const d = delta(plan);
  const gcols = groupCols(plan);
  const gone =
    plan.groups.length === 0
      ? `removed AS (
  DELETE FROM ${plan.targetSql} t WHERE NOT EXISTS (SELECT 1 FROM derived)
  RETURNING 1
)`
      : `gone AS MATERIALIZED (
  SELECT ${list(plan.key.map((k) => `t.${q(k)}`))} FROM ${plan.targetSql} t
  EXCEPT
  SELECT ${list(plan.key.map((k) => `dd.${q(k)}`))} FROM derived dd
),
${nullSafeDelete('removed', plan.targetSql, plan.key.map(q), 'gone', plan.key.map(q))}`;
  return `WITH changed AS MATERIALIZED (
  ${changedSql}
),
derived AS MATERIALIZED (
  ${targetRows(plan, d.statesSql, gcols.length ? 'x.n > 0' : null)}
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
${gone}
SELECT (SELECT count(*) FROM changed)::int AS keys,
       (SELECT count(*) FROM upserted)::int AS upserted,
       (SELECT count(*) FROM removed)::int AS removed`;
}

/**
 * The key map and group states of a transform kept by delta filled again from the
 * sources (emptied by the caller), before deltaRecomputeSql merges the target: the
 * build's first two statements (deltaFillStatements), in the same transaction.
 */
export function deltaRefillStatements(plan: TransformPlan): string[] {
  return deltaFillStatements(plan).slice(0, -1);
}

/**
 * Folds the groups given as `$1` (a JSON array of text arrays, one per group key) again
 * from their key-map rows, and writes their states and target rows: what a self-check's
 * repair runs once it has re-derived the rows of the groups it found diverged.
 */
export function deltaRegroupSql(plan: TransformPlan): string {
  const d = delta(plan);
  const gcols = groupCols(plan);
  const states = stateColumns(plan);
  const typed = plan.groups.map((grp, i) => `(e->>${i})::${grp.type} AS ${g(i)}`);
  const grandTotal = gcols.length === 0;
  const conflict = gcols.length ? `ON CONFLICT (${list(gcols)})` : 'ON CONFLICT ((true))';
  const stateNames = states.filter((c) => !gcols.includes(c.name)).map((c) => c.name);
  return `WITH asked AS MATERIALIZED (
  SELECT ${grandTotal ? '1 AS one' : list(typed)} FROM jsonb_array_elements($1::jsonb) e
),
refolded AS MATERIALIZED (
  SELECT ${list([...gcols, ...foldRows(plan)])}
    FROM ${withScaleWindows(
      plan,
      `(${nullSafeMatch(
        'm.*',
        plan.mapKind === 'shadow' ? `(${shadowJoinRows(plan, 'before')}) m` : `${plan.mapSql} m`,
        gcols.map((c) => `m.${c}`),
        'asked',
        gcols,
        plan.mapKind === 'shadow' ? null : 'm.passes',
      )})`,
    )} rows
   ${groupBy(gcols)}${grandTotal ? '\n  HAVING EXISTS (SELECT 1 FROM asked)' : ''}
),
final AS MATERIALIZED (
  SELECT ${list(gcols.map((c) => `a.${c}`))}${gcols.length ? ',' : ''} ${list(
    states
      .filter((c) => !gcols.includes(c.name))
      .map((c) => (c.name === 'n' ? 'coalesce(r.n, 0) AS n' : `r.${c.name}`)),
  )}
    FROM asked a LEFT JOIN refolded r
      ON ${gcols.length ? gcols.map((c) => `r.${c} IS NOT DISTINCT FROM a.${c}`).join(' AND ') : 'true'}
),
states_written AS (
  INSERT INTO ${d.statesSql} AS st (${list([...gcols, ...stateNames])})
  SELECT ${list([...gcols, ...stateNames])} FROM final${grandTotal ? '' : ' WHERE n > 0'}
  ${conflict} DO UPDATE SET ${list(stateNames.map((c) => `${c} = EXCLUDED.${c}`))}
  RETURNING 1
),${
    grandTotal
      ? ''
      : `
emptied AS MATERIALIZED (
  SELECT ${list(gcols)} FROM final WHERE n = 0
),
${nullSafeDelete('states_removed', d.statesSql, gcols, 'emptied', gcols)},`
  }
derived AS MATERIALIZED (
  ${targetRows(plan, 'final', grandTotal ? null : 'x.n > 0')}
),
upserted AS (
  ${upsert(plan, 'derived')}
  RETURNING 1
),
${removedSql(plan)}
SELECT (SELECT count(*) FROM upserted)::int AS upserted, (SELECT count(*) FROM removed)::int AS removed`;
}
