/**
 * trellis-pg: derived tables kept up to date incrementally, in your own Postgres.
 * @packageDocumentation
 */
export type {
  AggregateMaintenance,
  Definition,
  DefinitionColumn,
  DefinitionPart,
  DefinitionSource,
  Maintenance,
} from './catalog/definitions.js';
export type {
  ExplainedPart,
  ExplainedRead,
  ExplainMode,
  Explanation,
} from './catalog/explain.js';
export type {
  PoisonedRow,
  QuarantineCount,
  QuarantineEntry,
  QuarantineSample,
  ReleaseResult,
  SamplePage,
} from './catalog/quarantine.js';
export type * from './catalog/status-types.js';
export {
  isTrellisError,
  TRELLIS_ERROR_CODES,
  TrellisError,
  type TrellisErrorCode,
} from './errors.js';
export type { Logger, LogLevel } from './logger.js';
export { consoleLogger } from './logger.js';
export {
  metricsRegistry,
  prometheusContentType,
  renderPrometheus,
} from './metrics/registry.js';
export {
  type HealthReport,
  type MetricsServer,
  type ServeMetricsOptions,
  serveMetrics,
} from './metrics/serve-metrics.js';
export type {
  CaptureFailureEvent,
  HeldEvent,
  StatusEvent,
  TrellisEventMap,
  TrellisEventName,
  TrellisListener,
} from './observe/events.js';
export { type CaptureMode, type ConnectOptions, DEFAULTS } from './options.js';
export type { MigrateResult } from './schema/migrator.js';
export type {
  SelfCheckColumnDifference,
  SelfCheckFinding,
  SelfCheckJob,
  SelfCheckMode,
  SelfCheckOptions,
  SelfCheckReport,
  SelfCheckState,
} from './selfcheck/types.js';
export type { ApplyResult } from './statements/apply.js';
export { Trellis, type TrellisConfig, type TrellisSummary } from './trellis.js';
export type {
  DrainHealth,
  ElectedHealth,
  LoopError,
  LoopHealth,
  ProcessHealth,
} from './workers/health.js';
