/**
 * The builder `transform()` hands its callback: FROM, then JOINs, then SELECT and the
 * clauses after it; `distinctOn()` and `topN()` on a SELECT; `unionAll()`, `union()`,
 * `intersect()` and `except()` between SELECTs. Each step's types carry the statement's
 * source names (so a column of another table is a TypeScript error) and, for the target,
 * each select key's data type and nullability.
 */
import type { AnyColumn, SQL } from 'drizzle-orm';
import { TrellisError } from '../engine/errors.js';
import { emptyParts, type Parts, type TopN, type TransformSource } from './select.js';
import type { ColumnShape, SelectionShape } from './target-view.js';

type SourceName<S> = S extends { _: { name: infer N extends string } } ? N : never;

/** A column of one of the statement's sources (by the table name or alias it has). */
export type SourceColumn<TNames extends string> = AnyColumn<{ tableName: TNames }>;

/** A SELECT list: each key names a column of the target. */
export type Selection<TNames extends string> = Record<string, SourceColumn<TNames> | SQL<unknown>>;

/** Target columns by select key: what `transform()` makes a target of. */
export type Shape = Record<string, ColumnShape>;

/** A statement the builder made, whose target has the columns `TShape` describes. */
export interface TransformStatement<TShape> {
  /** @internal the target's columns, for the types only */
  readonly _shape: TShape;
}

/** The start of a statement: FROM comes first. */
export class TransformStart {
  /** `FROM source`: a drizzle table, an aliased table (`alias(t, 'a')`) or another target. */
  from<S extends TransformSource>(source: S): TransformSources<SourceName<S>, never> {
    return new TransformSources({ ...emptyParts(), from: source });
  }
}

/** FROM and JOINs given; SELECT comes next. */
export class TransformSources<TNames extends string, TNullable extends string> {
  /** @internal */
  constructor(readonly parts: Parts) {}

  /** `INNER JOIN source ON condition`. */
  innerJoin<S extends TransformSource>(
    source: S,
    on: SQL | undefined,
  ): TransformSources<TNames | SourceName<S>, TNullable> {
    this.parts.joins.push({ kind: 'INNER', source, on });
    return new TransformSources(this.parts);
  }

  /** `JOIN source ON condition` (an inner join). */
  join<S extends TransformSource>(
    source: S,
    on: SQL | undefined,
  ): TransformSources<TNames | SourceName<S>, TNullable> {
    return this.innerJoin(source, on);
  }

  /** `LEFT JOIN source ON condition`: the source's columns become nullable. */
  leftJoin<S extends TransformSource>(
    source: S,
    on: SQL | undefined,
  ): TransformSources<TNames | SourceName<S>, TNullable | SourceName<S>> {
    this.parts.joins.push({ kind: 'LEFT', source, on });
    return new TransformSources(this.parts);
  }

  /**
   * The SELECT list: each key names a target column, each value is a column of one of the
   * statement's tables or a `sql` expression over them.
   */
  select<S extends Selection<TNames>>(selection: S): TransformSelected<TNames, TNullable, S> {
    this.parts.selection = selection;
    return new TransformSelected(this.parts);
  }
}

/** An expression a clause lists: a column of the statement's sources, or `sql`/`desc(…)`. */
type Expr<TNames extends string> = SourceColumn<TNames> | SQL;

/** Options of {@link TransformSelected.topN}. */
export interface TopNOptions<TNames extends string> {
  /** `PARTITION BY`: the groups ranked apart. */
  partitionBy: Array<Expr<TNames>>;
  /** `ORDER BY` inside each group (`desc(col)` for the largest first). */
  orderBy: Array<Expr<TNames>>;
  /** The rows kept per group: rank `<= limit`. */
  limit: number;
  /** The ranking function (`rank` keeps ties, skipping ranks). @defaultValue `'row_number'` */
  rank?: TopN['rank'];
}

/**
 * The check that two SELECTs of a set operation have the same keys of the same data
 * types: `unknown` when they do, an object no SELECT is assignable to otherwise.
 */
type SameColumns<A, B> = [DataOf<A>] extends [DataOf<B>]
  ? [DataOf<B>] extends [DataOf<A>]
    ? unknown
    : ColumnsDiffer
  : ColumnsDiffer;
type DataOf<T> = { [K in keyof T]: T[K] extends { data: infer D } ? D : never };
interface ColumnsDiffer {
  'the SELECTs of a set operation select the same keys, of the same types': never;
}
/** A column of a set operation is NOT NULL when it is in every SELECT. */
type Merged<A, B> = {
  [K in keyof A]: {
    data: DataOf<A>[K];
    notNull: A[K] extends { notNull: true }
      ? K extends keyof B
        ? B[K] extends { notNull: true }
          ? true
          : false
        : false
      : false;
  };
};

/** A SELECT given as a branch of a set operation. */
type Branch<B> = TransformStatement<B> & { readonly parts: Parts };

export type SetOperator = 'UNION ALL' | 'UNION' | 'INTERSECT' | 'EXCEPT';

/** SELECT given; WHERE, GROUP BY, HAVING, options and set operations may follow. */
export class TransformSelected<
  TNames extends string,
  TNullable extends string,
  TSelection extends Selection<TNames>,
> implements TransformStatement<SelectionShape<TSelection, TNullable>>
{
  /** @internal */
  declare readonly _types: { names: TNames; nullable: TNullable; selection: TSelection };
  /** @internal */
  declare readonly _shape: SelectionShape<TSelection, TNullable>;

  /** @internal */
  constructor(readonly parts: Parts) {}

  /** `WHERE condition`. */
  where(condition: SQL | undefined): this {
    this.parts.where = condition;
    return this;
  }

  /** `GROUP BY expr, …`: the target is keyed by these expressions. */
  groupBy(...expressions: Array<Expr<TNames>>): this {
    this.parts.groupBy = expressions;
    return this;
  }

  /** `HAVING condition`. */
  having(condition: SQL | undefined): this {
    this.parts.having = condition;
    return this;
  }

  /**
   * `SELECT DISTINCT ON (on…) … ORDER BY on…, orderBy…`: one row per distinct `on`, the
   * first by `orderBy` (`desc(col)` for the latest). Written in the AS form.
   */
  distinctOn(on: Array<Expr<TNames>>, orderBy: Array<Expr<TNames>> = []): this {
    this.parts.distinctOn = { on, orderBy };
    return this;
  }

  /**
   * Top-N per group: the rows whose `row_number()` (or `rank()`, `dense_rank()`) `OVER
   * (PARTITION BY … ORDER BY …)` is at most `limit`. Written in the AS form, as a derived
   * table filtered by its rank.
   */
  topN(options: TopNOptions<TNames>): this {
    const { partitionBy, orderBy, limit, rank = 'row_number' } = options;
    this.parts.topN = { partitionBy, orderBy, limit, rank };
    return this;
  }

  /** `WITHOUT SOURCE INDEX`: accept the source index gaps the drain's lookups have. */
  withoutSourceIndex(): this {
    this.parts.withoutSourceIndex = true;
    return this;
  }

  /**
   * `WITHOUT ROW SECURITY`: accept sources with row level security, whose target holds
   * every row Trellis's role reads, for whoever may read the target (ADR 0034).
   */
  withoutRowSecurity(): this {
    this.parts.withoutRowSecurity = true;
    return this;
  }

  /** `this UNION ALL other`: every row of both (the same keys, of the same types). */
  unionAll<B>(other: Branch<B> & SameColumns<SelectionShape<TSelection, TNullable>, B>) {
    return setOperation<SelectionShape<TSelection, TNullable>, B>(this, 'UNION ALL', other);
  }

  /** `this UNION other`: the rows of either, each once. */
  union<B>(other: Branch<B> & SameColumns<SelectionShape<TSelection, TNullable>, B>) {
    return setOperation<SelectionShape<TSelection, TNullable>, B>(this, 'UNION', other);
  }

  /** `this INTERSECT other`: the rows of both, each once. */
  intersect<B>(other: Branch<B> & SameColumns<SelectionShape<TSelection, TNullable>, B>) {
    return setOperation<SelectionShape<TSelection, TNullable>, B>(this, 'INTERSECT', other);
  }

  /** `this EXCEPT other`: the rows of this one not in the other, each once. */
  except<B>(other: Branch<B> & SameColumns<SelectionShape<TSelection, TNullable>, B>) {
    return setOperation<SelectionShape<TSelection, TNullable>, B>(this, 'EXCEPT', other);
  }
}

function setOperation<A, B>(
  left: TransformStatement<A> & { parts?: Parts; branches?: SetBranch[] },
  op: SetOperator,
  right: Branch<B>,
): TransformSetOperation<Merged<A, B>> {
  if (!(right instanceof TransformSelected)) {
    throw new TrellisError(
      'validation',
      `${op}: the other side is a t.from(…).select(…) of the same builder`,
    );
  }
  const branches: SetBranch[] = left.branches
    ? [...left.branches]
    : [{ op: null, parts: left.parts as Parts }];
  branches.push({ op, parts: right.parts });
  return new TransformSetOperation(branches);
}

export interface SetBranch {
  /** The operator before this SELECT; null for the first. */
  op: SetOperator | null;
  parts: Parts;
}

/** SELECTs combined by set operators, left to right (`a.union(b).except(c)`). */
export class TransformSetOperation<TShape> implements TransformStatement<TShape> {
  /** @internal */
  declare readonly _shape: TShape;
  /** @internal the statement's trailing options */
  readonly options = { withoutSourceIndex: false, withoutRowSecurity: false };

  /** @internal */
  constructor(readonly branches: SetBranch[]) {}

  /** `… UNION ALL other`. */
  unionAll<B>(other: Branch<B> & SameColumns<TShape, B>) {
    return this.next<B>('UNION ALL', other);
  }

  /** `… UNION other`. */
  union<B>(other: Branch<B> & SameColumns<TShape, B>) {
    return this.next<B>('UNION', other);
  }

  /** `(…) INTERSECT other`: what comes before is bracketed (INTERSECT binds tighter in SQL). */
  intersect<B>(other: Branch<B> & SameColumns<TShape, B>) {
    return this.next<B>('INTERSECT', other);
  }

  /** `… EXCEPT other`. */
  except<B>(other: Branch<B> & SameColumns<TShape, B>) {
    return this.next<B>('EXCEPT', other);
  }

  /** `WITHOUT SOURCE INDEX`, for the whole statement. */
  withoutSourceIndex(): this {
    this.options.withoutSourceIndex = true;
    return this;
  }

  /** `WITHOUT ROW SECURITY`, for the whole statement. */
  withoutRowSecurity(): this {
    this.options.withoutRowSecurity = true;
    return this;
  }

  private next<B>(op: SetOperator, other: Branch<B>) {
    const combined = setOperation<TShape, B>(this, op, other);
    Object.assign(combined.options, this.options);
    return combined;
  }
}
