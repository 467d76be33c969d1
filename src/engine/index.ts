/**
 * trellis-pg: derived tables kept up to date incrementally, in your own Postgres.
 * @packageDocumentation
 */
export {
  isTrellisError,
  TRELLIS_ERROR_CODES,
  TrellisError,
  type TrellisErrorCode,
} from './errors.js';
export type { Logger, LogLevel } from './logger.js';
export { consoleLogger } from './logger.js';
export { type ConnectOptions, DEFAULTS } from './options.js';
export type { MigrateResult } from './schema/migrator.js';
export { Trellis, type TrellisConfig } from './trellis.js';
