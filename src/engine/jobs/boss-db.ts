import type PgBoss from 'pg-boss';
import type { Session } from '../db/session.js';

/**
 * pg-boss's database adapter (`{ executeSql }`) over Trellis's own sessions, so pg-boss
 * opens no connection of its own: every engine connection is postgres.js (CONTRACT.md),
 * on a budget the handle sets, with its deadlines and cancellation (ADR 0014).
 *
 * pg-boss was written for node-postgres. postgres.js binds parameters by the types the
 * server describes for them (a JS array for an array type, an object for json), which is
 * what pg-boss passes for every statement Trellis uses (send, fetch, complete, fail,
 * maintenance); only `undefined` needs turning into NULL. A text without parameters may
 * hold several statements (pg-boss's maintenance plans are `BEGIN; …; COMMIT;`): it runs
 * by the simple query protocol, as node-postgres runs it; pg-boss reads no rows from those.
 */
export async function executeOn(
  session: Session,
  text: string,
  values: readonly unknown[] | undefined,
): Promise<{ rows: Record<string, unknown>[] }> {
  if (!values || values.length === 0) {
    const result = await session.simpleQuery(text);
    const several = result.length > 0 && Array.isArray(result[0]);
    return { rows: several ? [] : (result as Record<string, unknown>[]) };
  }
  return {
    rows: await session.query(
      text,
      values.map((v) => (v === undefined ? null : v)),
    ),
  };
}

/** A pg-boss `db` that runs everything on one session (a call's, inside its transaction). */
export function sessionDb(session: Session): PgBoss.Db {
  return { executeSql: (text, values) => executeOn(session, text, values) };
}

/** A pg-boss `db` that takes a session for each statement from `acquire`. */
export function pooledDb(acquire: () => Promise<Session>): PgBoss.Db {
  return {
    async executeSql(text, values) {
      const session = await acquire();
      try {
        return await executeOn(session, text, values);
      } finally {
        await session.release();
      }
    },
  };
}
