/**
 * The text of a set operation's statement (`SELECT … UNION ALL SELECT …`, always the AS
 * form) and the target columns it makes: named and typed as the first SELECT's, NOT NULL
 * where every SELECT's column is.
 */
import { TrellisError } from '../engine/errors.js';
import type { SetBranch } from './builder.js';
import type { RenderScope } from './render.js';
import { renderSelect } from './select.js';
import type { TargetColumnSpec } from './target-view.js';

export function renderSetOperation(
  branches: readonly SetBranch[],
  what: string,
  scope: RenderScope,
): { lines: string[]; columns: TargetColumnSpec[]; options: string[] } {
  let lines: string[] = [];
  let columns: TargetColumnSpec[] = [];
  let keys: string[] | undefined;
  let mixed = false;
  const options = { withoutSourceIndex: false, withoutRowSecurity: false };
  branches.forEach(({ op, parts }, i) => {
    const where = `${what}: SELECT ${i + 1} of the ${branches[1]?.op ?? ''}`;
    if (parts.distinctOn) {
      throw new TrellisError(
        'validation',
        `${where}: DISTINCT ON in a set operation: make it a transform of its own and select from its target`,
      );
    }
    const rendered = renderSelect(parts, where, scope, [], keys);
    options.withoutSourceIndex ||= parts.withoutSourceIndex;
    options.withoutRowSecurity ||= parts.withoutRowSecurity;
    if (op === null) {
      keys = rendered.columns.map((c) => c.key);
      columns = rendered.columns;
      lines = rendered.viewSql;
      return;
    }
    columns = columns.map((c, n) => ({
      ...c,
      notNull: c.notNull && (rendered.columns[n]?.notNull ?? false),
    }));
    // INTERSECT binds tighter than UNION and EXCEPT: what came before is bracketed.
    if (op === 'INTERSECT' && mixed) lines = ['(', ...lines, ')'];
    mixed ||= op !== 'INTERSECT';
    lines.push(op, ...rendered.viewSql);
  });
  const trailing = [
    ...(options.withoutSourceIndex ? ['WITHOUT SOURCE INDEX'] : []),
    ...(options.withoutRowSecurity ? ['WITHOUT ROW SECURITY'] : []),
  ];
  return { lines, columns, options: trailing };
}
