import { TrellisError } from '../../engine/errors.js';

/**
 * Checks the pg_dump arguments a `trellis dump` passes through. The dump is schema-only, in
 * plain SQL (the definitions are appended as text), of the database the definitions are
 * read from, and it must carry Trellis's schema: the definitions restore into it.
 */
export function checkPgDumpArgs(args: readonly string[], schema: string): void {
  const includes: string[] = [];
  const excludes: string[] = [];
  for (let i = 0; i < args.length; i += 1) {
    const arg = args[i]!;
    const value = (short: string, long: string): string | undefined => {
      if (arg === short || arg === long) return args[++i];
      if (arg.startsWith(`${long}=`)) return arg.slice(long.length + 1);
      if (short.length === 2 && arg.startsWith(short) && !arg.startsWith('--')) return arg.slice(2);
      return undefined;
    };
    const refuse = (why: string): never => {
      throw new TrellisError('validation', `trellis dump cannot pass ${arg} to pg_dump: ${why}`);
    };
    if (/^(-a|--data-only)$/.test(arg)) refuse('the dump is schema-only (--schema-only)');
    if (/^(-f|--file)(=|$)/.test(arg) || /^-f./.test(arg)) refuse('use trellis dump --file');
    if (
      /^(-d|--dbname|-h|--host|-p|--port|-U|--username)(=|$)/.test(arg) ||
      /^-[dhpU]./.test(arg)
    ) {
      refuse(
        'the connection comes from --url or DATABASE_URL, so the DDL and the definitions come from one database',
      );
    }
    if (/^(-t|--table)(=|$)/.test(arg) || /^-t./.test(arg)) {
      refuse(
        `a table list leaves out Trellis's schema "${schema}": leave tables out with -T instead`,
      );
    }
    const format = value('-F', '--format');
    if (format !== undefined && !/^p(lain)?$/i.test(format)) {
      refuse('the definitions are appended as SQL text, so the dump must be plain SQL (-F p)');
    }
    const include = value('-n', '--schema');
    if (include !== undefined) includes.push(include);
    const exclude = value('-N', '--exclude-schema');
    if (exclude !== undefined) excludes.push(exclude);
  }
  if (includes.length > 0 && !includes.some((p) => schemaPatternMatches(p, schema))) {
    throw new TrellisError(
      'validation',
      `the dump names its schemas (${includes.map((p) => `-n ${p}`).join(' ')}) and leaves out Trellis's schema "${schema}": add -n ${quoteForPattern(schema)}`,
    );
  }
  const excluding = excludes.find((p) => schemaPatternMatches(p, schema));
  if (excluding !== undefined) {
    throw new TrellisError(
      'validation',
      `-N ${excluding} leaves out Trellis's schema "${schema}", which the definitions restore into`,
    );
  }
}

/** A schema name as a pg_dump pattern that matches it alone. */
function quoteForPattern(name: string): string {
  return /^[a-z_][a-z0-9_]*$/.test(name) ? name : `'"${name.replaceAll('"', '""')}"'`;
}

/**
 * Whether a pg_dump schema pattern matches `name`, with pg_dump's (psql's) rules: outside
 * double quotes letters fold to lower case, `*` is any run of characters and `?` any one;
 * inside them every character stands for itself (`""` for a quote). A pattern naming a
 * database too (`db.schema`) is matched on its last part.
 */
export function schemaPatternMatches(pattern: string, name: string): boolean {
  const parts: string[] = [''];
  let quoted = false;
  for (let i = 0; i < pattern.length; i += 1) {
    const ch = pattern[i]!;
    if (ch === '"') {
      if (quoted && pattern[i + 1] === '"') {
        parts[parts.length - 1] += '"';
        i += 1;
      } else {
        quoted = !quoted;
      }
    } else if (!quoted && ch === '.') {
      parts.push('');
    } else if (!quoted && ch === '*') {
      parts[parts.length - 1] += '.*';
    } else if (!quoted && ch === '?') {
      parts[parts.length - 1] += '.';
    } else {
      const c = quoted ? ch : ch.toLowerCase();
      parts[parts.length - 1] += c.replace(/[\\^$.*+?()[\]{}|/-]/g, '\\$&');
    }
  }
  return new RegExp(`^(?:${parts[parts.length - 1]})$`, 's').test(name);
}
