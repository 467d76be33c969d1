/**
 * The key under which `transform()` keeps a target's statement on its drizzle object. A
 * module of its own, free of drizzle-orm, so the CLI can find targets in an app's module
 * without loading drizzle itself; registered with Symbol.for, so every copy of trellis-pg
 * in a process (the CLI's, the app's) reads the same key.
 */
export const TARGET_KEY = Symbol.for('trellis-pg:transform');

/** What `transform()` records on the target object. */
export interface TransformDefinition {
  /** The target's name (a table in the instance's target schema). */
  target: string;
  /** The TRANSFORM statement, ready for `apply()`, `applyStatementSql()` or a migration. */
  statement: string;
  /** Targets of other transforms this one reads (a chain): they must be defined first. */
  reads: string[];
  /**
   * Present when `transform()` was given no `casing`: the definition as that casing names
   * its columns (source columns declared without a name, and the target's), which
   * `trellis generate transform --from` uses with the casing of the app's drizzle config
   * (drizzle-kit names those tables' columns by it).
   */
  withCasing?: (casing: 'snake_case' | 'camelCase') => TransformDefinition;
}

/** The definition a target carries, or undefined for anything else. */
export function definitionOn(value: unknown): TransformDefinition | undefined {
  if (typeof value !== 'object' || value === null || !(TARGET_KEY in value)) return undefined;
  return (value as Record<symbol, TransformDefinition | undefined>)[TARGET_KEY];
}
