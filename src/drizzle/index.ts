/**
 * Trellis for apps that use Drizzle ORM and drizzle-kit.
 *
 * - `transform(name, t => t.from(…).select(…)…)` builds a TRANSFORM statement from drizzle
 *   tables (columns checked by TypeScript, values written as literals) and returns the
 *   target as a typed, read-only drizzle object: `db.select().from(target)`. drizzle-kit
 *   sees it as an existing view and never writes DDL for it.
 * - `statementOf(target)` is the statement, for `apply()`, `applyStatementSql()` or
 *   `trellis generate transform --from <module>`.
 * - `subquery(s => s.from(…).select(…))` is a subquery for drizzle's `exists()`,
 *   `notExists()`, `inArray()` and `notInArray()` in a statement's WHERE; `.distinctOn()`,
 *   `.topN()`, `.unionAll()`, `.union()`, `.intersect()` and `.except()` write the rest of
 *   view SQL the builder knows, and `derived(alias, s => …)` a subquery in FROM (the
 *   statement is then in the AS form).
 * - `applyStatementSql(statement)` is the line a drizzle-kit custom migration runs.
 *
 * drizzle-orm (a peer dependency of this entry point only) is imported here; the engine
 * (`trellis-pg`) never imports it.
 * @packageDocumentation
 */
export { type ApplyStatementSqlOptions, applyStatementSql } from './apply-sql.js';
export { derived } from './derived.js';
export {
  indexesFor,
  type SourceIndex,
  type SourceIndexRole,
  sourceIndexesOf,
} from './indexes.js';
export type { Casing } from './render.js';
export { subquery, type TransformSubquery } from './subqueries.js';
export {
  type AnyTrellisTarget,
  casingOf,
  type DrizzleDatabase,
  isTrellisTarget,
  type Selection,
  type SetOperator,
  type SourceColumn,
  statementOf,
  type TargetColumns,
  type TopNOptions,
  type TransformDefinition,
  type TransformOptions,
  TransformSelected,
  TransformSetOperation,
  type TransformSource,
  TransformSources,
  TransformStart,
  type TransformStatement,
  type TrellisTarget,
  transform,
  transformDefinition,
} from './transform.js';
