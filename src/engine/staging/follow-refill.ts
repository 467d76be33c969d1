import type { Session } from '../db/session.js';
import { loadPlan } from '../drain/plan.js';
import { rederiveWhole } from '../drain/rebuild-merge.js';
import { isRowError } from '../drain/row-errors.js';
import { enterTransformWork } from '../drain/work-settings.js';
import { quoteIdent, quoteLiteral } from '../identifiers.js';
import type { Logger } from '../logger.js';

/**
 * The second half of following a source change (ADR 0047; the first is
 * `_follow_source_columns`, on the same reconcile pass, before capture is reconciled to the
 * renamed columns): each transform followed is re-derived whole, in one transaction, so a
 * reader sees its target as it was or as it is now, never in between.
 *
 * - The transaction takes the transform's page slots and pipeline row, as the drain does to
 *   apply changes, so no page is being applied meanwhile; pages left of an open range are
 *   dropped (the re-derivation covers them).
 * - A tick is taken first: every change committed before it is in the sources the
 *   re-derivation reads next, so the transform's cursor moves to it, past any "any row
 *   changed" row capture wrote while its triggers still named the old columns. Changes
 *   committed between the tick and the re-derivation are applied again by the drain,
 *   which re-derives from the sources as they are: harmless.
 * - The key map (and group states) are made again for the new key types and filled with
 *   the target's rows into a scratch table; the target is then merged with it (rows that
 *   differ written, rows gone deleted), as the drain writes it: a chain reading the target
 *   sees keyed changes, not a TRUNCATE.
 *
 * A transform not live yet is built again instead (it is being built anyway), as is one
 * whose re-derivation fails on a row (a build holds such rows' keys one by one).
 */
export async function refillFollowed(session: Session, schema: string, log: Logger): Promise<void> {
  const s = quoteIdent(schema);
  const pending = await session.query<{ transform_id: number }>(
    `SELECT transform_id FROM ${s}.pipeline WHERE follow_pending ORDER BY transform_id`,
  );
  for (const { transform_id: id } of pending) {
    const outcome = await session.transaction(async () => {
      await session.query(
        `SELECT 1 FROM ${s}.page_slots WHERE transform_id = $1 ORDER BY bucket FOR UPDATE`,
        [id],
      );
      const [p] = await session.query<{ phase: string; follow_pending: boolean; paused: boolean }>(
        `SELECT p.phase, p.follow_pending, t.paused_at IS NOT NULL AS paused
           FROM ${s}.pipeline p JOIN ${s}.transforms t ON t.id = p.transform_id
          WHERE p.transform_id = $1 FOR UPDATE OF p`,
        [id],
      );
      if (!p?.follow_pending) return 'gone';
      if (p.paused) {
        // Not followed, and stopped for it (or paused by an operator): RESUME rebuilds.
        await clearPending(session, schema, id);
        return 'stopped';
      }
      await session.query(`SELECT ${s}._follow_remap($1)`, [id]);
      if (p.phase !== 'live' && p.phase !== 'catching_up') {
        await session.query(`SELECT ${s}._request_rebuild($1)`, [id]);
        await clearPending(session, schema, id);
        return 'rebuilt';
      }
      const [tick] = await session.query<{ seq: string }>(
        `INSERT INTO ${s}.ticks (seq, snap)
         VALUES (nextval(${quoteLiteral(`${s}.tick_seq`)}), pg_current_snapshot()) RETURNING seq`,
      );
      const plan = await loadPlan(session, schema, id);
      await enterTransformWork(session, schema, plan);
      await session.query('SAVEPOINT trellis_refill');
      try {
        await rederiveWhole(session, plan);
        await session.query('RELEASE SAVEPOINT trellis_refill');
      } catch (error) {
        await session.query('ROLLBACK TO SAVEPOINT trellis_refill');
        if (!isRowError(error)) throw error;
        log.warn(
          { target: plan.target, error: (error as Error).message },
          'a followed source change failed on a row while re-deriving: the target is built again',
        );
        await session.query(`SELECT ${s}._request_rebuild($1)`, [id]);
        await clearPending(session, schema, id);
        return 'rebuilt';
      }
      await session.query(`DELETE FROM ${s}.pages WHERE transform_id = $1`, [id]);
      await session.query(
        `UPDATE ${s}.pipeline
            SET cursor_tick = $2, open_lo = NULL, open_hi = NULL, open_pages = NULL,
                pages_left = NULL, follow_pending = false, updated_at = now()
          WHERE transform_id = $1`,
        [id, tick!.seq],
      );
      return 'rederived';
    });
    log.info({ transformId: id, outcome }, 'a followed source change was applied to its target');
  }
}

async function clearPending(session: Session, schema: string, id: number): Promise<void> {
  await session.query(
    `UPDATE ${quoteIdent(schema)}.pipeline SET follow_pending = false WHERE transform_id = $1`,
    [id],
  );
}
