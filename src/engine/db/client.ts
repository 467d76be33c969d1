import postgres from 'postgres';
import { builtinArrayTypes } from './array-types.js';

/**
 * Every postgres.js client Trellis makes (the engine's sessions, the test harness's admin
 * clients) is made here, with the options that keep a lost connection from escaping as an
 * unhandled rejection (ADR 0007): no type fetch at connect (the array types it would have
 * learnt are declared instead), and server notices dropped.
 */
export function createClient(
  url: string,
  options: postgres.Options<Record<string, postgres.PostgresType>> = {},
): postgres.Sql {
  const sql = postgres(url, {
    onnotice: () => undefined,
    ...options,
    fetch_types: false,
    types: { ...builtinArrayTypes(), ...options.types },
  });
  // With fetch_types off, postgres.js 3.4.9 never hands out a reserved connection that it
  // has to open for the reservation: the promise stays pending for ever. Fail loudly.
  sql.reserve = () =>
    Promise.reject(
      new Error(
        'reserve() hangs in postgres.js 3.4.9 without a type fetch: use a client with max: 1',
      ),
    );
  return sql;
}
