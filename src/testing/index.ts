/**
 * Test support for suites of apps that use Trellis: a throwaway Postgres server, and (as
 * the engine grows) helpers for fixtures loaded with triggers disabled.
 */
export {
  type CreatedDatabase,
  type PostgresKind,
  type StartPostgresOptions,
  startPostgres,
  type TestPostgres,
} from './postgres.js';
