/**
 * The statements that take the transforms the folder's migrations define (the snapshot) to
 * those a module declares (ADR 0048), as drizzle-kit diffs tables:
 * - a new target: its TRANSFORM statement;
 * - a removed one: DROP TRANSFORM, only when the caller confirmed drops;
 * - a changed one: ALTER TRANSFORM … ADD COLUMN / DROP COLUMN when that is all that
 *   changed (columns appended, or columns removed), else `ALTER TRANSFORM … AS` and its new
 *   definition (redefined in place, readers never interrupted: ADR 0055); a chain reading
 *   it follows on its own (its unchanged statement is not written again);
 * - drops first, dependants before what they read; then definitions and ALTERs, a chain's
 *   upstream first.
 */
import { TrellisError } from '../../engine/errors.js';
import { quoteIdent } from '../../engine/identifiers.js';
import type { SnapshotTransform } from './transform-snapshot.js';

/** A statement's parse tree, as `<schema>.parse_statement` returns it. */
export type Ast = Record<string, unknown>;

export interface Declared {
  target: string;
  statement: string;
  reads: string[];
}

export interface TransformDiff {
  statements: string[];
  /** One line per target changed: `+ x` defined, `- x` dropped, `~ x` altered, `± x` redefined. */
  summary: string[];
  /** Targets the module no longer declares. */
  removed: string[];
}

interface SelectItem {
  expr: string;
  name: string | null;
}

function selectOf(ast: Ast): SelectItem[] {
  return ((ast.select as SelectItem[] | undefined) ?? []).map((s) => ({
    expr: s.expr,
    name: s.name,
  }));
}

const same = (a: SelectItem, b: SelectItem) => a.expr === b.expr && a.name === b.name;

/**
 * The ALTERs that take `before` to `after`, or null when the grammar cannot say it (only
 * SELECT items appended, or removed, are): [] when they mean the same statement.
 */
export function alterations(target: string, before: Ast, after: Ast): string[] | null {
  const rest = (ast: Ast) => JSON.stringify({ ...ast, select: null });
  if (rest(before) !== rest(after)) return null;
  const was = selectOf(before);
  const now = selectOf(after);
  if ([...was, ...now].some((s) => s.name === null)) {
    return was.length === now.length && was.every((s, i) => same(s, now[i] as SelectItem))
      ? []
      : null;
  }
  const t = quoteIdent(target);
  if (now.length >= was.length && was.every((s, i) => same(s, now[i] as SelectItem))) {
    return now
      .slice(was.length)
      .map((s) => `ALTER TRANSFORM ${t} ADD COLUMN ${s.expr} AS ${quoteIdent(s.name as string)}`);
  }
  if (now.length < was.length) {
    // `now` must be `was` with some items left out, in the same order.
    const dropped: SelectItem[] = [];
    let i = 0;
    for (const s of was) {
      if (i < now.length && same(s, now[i] as SelectItem)) i += 1;
      else dropped.push(s);
    }
    if (i === now.length) {
      return dropped.map((s) => `ALTER TRANSFORM ${t} DROP COLUMN ${quoteIdent(s.name as string)}`);
    }
  }
  return null;
}

/** A TRANSFORM's name (a bare word or a quoted identifier, with a schema or without), and the space after it. */
const TRANSFORM_HEAD =
  /^\s*TRANSFORM\s+((?:"(?:[^"]|"")*"|[^\s".]+)(?:\s*\.\s*(?:"(?:[^"]|"")*"|[^\s".]+))?)(\s+)/i;

/**
 * `TRANSFORM t FROM … SELECT …` → `ALTER TRANSFORM t AS FROM … SELECT …`, and
 * `TRANSFORM t AS SELECT …` → `ALTER TRANSFORM t AS SELECT …` (ADR 0055): the redefinition
 * of a target to the statement it is now declared by, its text kept as written (line
 * breaks included), so the snapshot made from migrations gives the statement back.
 */
export function redefinition(statement: string): string {
  const head = TRANSFORM_HEAD.exec(statement);
  if (!head) {
    throw new TrellisError('validation', `not a TRANSFORM statement: ${statement.slice(0, 80)}`);
  }
  const rest = statement.slice(head[0].length);
  return /^AS\s/i.test(rest)
    ? `ALTER TRANSFORM ${head[1]}${head[2]}${rest}`
    : `ALTER TRANSFORM ${head[1]} AS${head[2]}${rest}`;
}

/** `names` ordered so a target comes after those it reads (as far as `reads` says). */
function upstreamFirst(names: string[], reads: (name: string) => string[]): string[] {
  const ordered: string[] = [];
  const visit = (name: string, path: string[]) => {
    if (ordered.includes(name) || !names.includes(name) || path.includes(name)) return;
    for (const upstream of reads(name)) visit(upstream, [...path, name]);
    ordered.push(name);
  };
  for (const name of [...names].sort()) visit(name, []);
  return ordered;
}

export function diffTransforms(options: {
  declared: Declared[];
  previous: Record<string, SnapshotTransform>;
  /** The parse tree of every statement, declared and previous, by its text. */
  parsed: Map<string, Ast>;
  allowDrop: boolean;
}): TransformDiff {
  const { declared, previous, parsed } = options;
  const declaredNames = new Set(declared.map((d) => d.target));
  const ast = (statement: string) => parsed.get(statement) as Ast;
  const previousReads = (name: string) => {
    const before = previous[name];
    if (!before) return [];
    if (before.reads.length > 0) return before.reads;
    // A snapshot made from migrations holds no reads: its FROM and JOINs say them.
    const tree = ast(before.statement);
    const sources = [tree.from, ...((tree.joins as unknown[] | undefined) ?? [])] as Array<{
      name: string;
    }>;
    return sources.map((s) => s.name).filter((n) => n in previous);
  };

  const removed = Object.keys(previous)
    .filter((n) => !declaredNames.has(n))
    .sort();
  if (removed.length > 0 && !options.allowDrop) {
    throw new TrellisError(
      'validation',
      `the schema file no longer declares ${removed.join(', ')}: pass --allow-drop to write DROP TRANSFORM for ${removed.length > 1 ? 'them' : 'it'} (the target${removed.length > 1 ? 's are' : ' is'} dropped, rows and all)`,
    );
  }
  const altered = new Map<string, string[]>();
  const redefined = new Set<string>();
  for (const d of declared) {
    const before = previous[d.target];
    if (!before || before.statement === d.statement) continue;
    const alters = alterations(d.target, ast(before.statement), ast(d.statement));
    if (alters === null) redefined.add(d.target);
    else altered.set(d.target, alters);
  }
  // A target reading a redefined one follows it (ADR 0055): nothing to write for it.
  const reads = new Map(declared.map((d) => [d.target, d.reads]));

  const statements: string[] = [];
  const summary: string[] = [];
  const drops = upstreamFirst(removed, previousReads).reverse();
  for (const name of drops) {
    statements.push(`DROP TRANSFORM ${quoteIdent(name)}`);
    summary.push(`- ${name}`);
  }
  const order = upstreamFirst([...declaredNames], (n) => reads.get(n) ?? []);
  for (const name of order) {
    const d = declared.find((x) => x.target === name) as Declared;
    if (!(name in previous)) {
      statements.push(d.statement);
      summary.push(`+ ${name}`);
    } else if (redefined.has(name)) {
      statements.push(redefinition(d.statement));
      summary.push(`± ${name}`);
    } else if (altered.has(name)) {
      const alters = altered.get(name) as string[];
      statements.push(...alters);
      if (alters.length > 0) summary.push(`~ ${name}`);
    }
  }
  return { statements, summary, removed };
}
