import type { Session } from '../db/session.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';

/**
 * How long a ledger generation takes writes before the next one takes over. Not an
 * option: an engine setting, which this package's own tests shorten.
 */
export const LEDGER_ROTATION = { afterMs: 30_000 };

/**
 * The oldest tick some transform still reads from: its cursor (or the newest tick when no
 * transform has one). Ledger rows and ticks older than that are never read again.
 */
const OLDEST_NEEDED_TICK = (s: string) => `coalesce(
  (SELECT min(cursor_tick) FROM ${s}.pipeline WHERE cursor_tick IS NOT NULL),
  (SELECT max(seq) FROM ${s}.ticks))`;

/**
 * Keeps the ledger small without DELETE: writes rotate through three generations, and a
 * generation is TRUNCATEd once every transaction that could write it has ended and every
 * cursor has moved past them. Old ticks are pruned. Each step is its own short transaction.
 */
export async function maintainLedger(session: Session, schema: string, log: Logger): Promise<void> {
  const s = quoteIdent(schema);
  await retireCurrent(session, s, log);
  await truncateRetired(session, schema, log);
  await session.query(
    `DELETE FROM ${s}.ticks WHERE seq < ${OLDEST_NEEDED_TICK(s)} AND seq < (SELECT max(seq) FROM ${s}.ticks)`,
  );
}

async function retireCurrent(session: Session, s: string, log: Logger): Promise<void> {
  const seq = quoteLiteral(`${s}.ledger_generation`);
  await session.transaction(async () => {
    // Writers read the current generation from the sequence; the table follows it. A crash
    // between the two steps below is mended here on the next pass.
    const [state] = await session.query<{ current: number; marked: number | null }>(
      `SELECT (SELECT last_value FROM ${s}.ledger_generation)::int AS current,
              (SELECT gen FROM ${s}.generations WHERE state = 'current' FOR UPDATE) AS marked`,
    );
    if (!state) return;
    if (state.marked !== null && state.marked !== state.current) {
      await retire(session, s, state.marked, state.current);
      return;
    }
    const [due] = await session.query<{ due: boolean }>(
      `SELECT (SELECT since FROM ${s}.generations WHERE gen = $1) < now() - make_interval(secs => $2::float8 / 1000)
              AND (SELECT state FROM ${s}.generations WHERE gen = ($1 + 1) % 3) = 'free' AS due`,
      [state.current, LEDGER_ROTATION.afterMs],
    );
    if (!due?.due) return;
    const next = (state.current + 1) % 3;
    await session.query(`SELECT setval(${seq}::regclass, $1, true)`, [next]);
    await retire(session, s, state.current, next);
    log.debug({ from: state.current, to: next }, 'ledger generation rotated');
  });
}

/** Marks `old` retired as of now: transactions with xids below this snapshot's xmax may still write it. */
async function retire(session: Session, s: string, old: number, next: number): Promise<void> {
  await session.query(
    `UPDATE ${s}.generations
        SET state = CASE WHEN gen = $1 THEN 'retired' ELSE 'current' END, since = now(),
            retired_xmax = CASE WHEN gen = $1 THEN pg_snapshot_xmax(pg_current_snapshot()) END
      WHERE gen IN ($1, $2)`,
    [old, next],
  );
}

async function truncateRetired(session: Session, schema: string, log: Logger): Promise<void> {
  const s = quoteIdent(schema);
  const [ready] = await session.query<{ gen: number | null }>(
    `SELECT g.gen FROM ${s}.generations g
      WHERE g.state = 'retired'
        AND g.retired_xmax <= (SELECT pg_snapshot_xmin(snap) FROM ${s}.ticks WHERE seq = ${OLDEST_NEEDED_TICK(s)})
      LIMIT 1`,
  );
  if (ready?.gen == null) return;
  try {
    await session.transaction(async () => {
      // Drains read the ledger through its parent and so lock every partition for a moment:
      // wait briefly, and try again on a later pass rather than queue writers behind us.
      await session.query(`SET LOCAL lock_timeout = '100ms'`);
      await session.query(`TRUNCATE ${s}.${quoteIdent(`ledger_${ready.gen}`)}`);
      await session.query(
        `UPDATE ${s}.generations SET state = 'free', since = now(), retired_xmax = NULL WHERE gen = $1`,
        [ready.gen],
      );
    });
    log.debug({ gen: ready.gen }, 'ledger generation truncated');
  } catch (error) {
    if (sqlstateOf(error) !== SQLSTATE.lockNotAvailable) throw error;
  }
}
