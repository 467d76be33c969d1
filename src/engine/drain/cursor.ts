import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';

/**
 * The transform has applied every change up to tick `hi`: its cursor moves there. A
 * transform catching up is live from then on.
 */
export async function advanceCursor(
  session: Session,
  schema: string,
  transformId: number,
  hi: string | number,
): Promise<void> {
  await session.query(
    `UPDATE ${quoteIdent(schema)}.pipeline
        SET cursor_tick = $2, open_lo = NULL, open_hi = NULL, open_pages = NULL, pages_left = NULL,
            live_since = CASE WHEN phase = 'catching_up' THEN now() ELSE live_since END,
            phase = CASE WHEN phase = 'catching_up' THEN 'live' ELSE phase END,
            updated_at = now()
      WHERE transform_id = $1`,
    [transformId, hi],
  );
}
