/**
 * Test support for suites of apps that use Trellis: a throwaway Postgres server, and the
 * helper for fixtures loaded with triggers disabled.
 */
export {
  type CreatedDatabase,
  type PostgresKind,
  type StartPostgresOptions,
  startPostgres,
  type TestPostgres,
} from './postgres.js';
export { ResumeRefused, resumeCaptureDisruptions } from './resume-disruptions.js';
