import type { Session } from '../db/session.js';
import { quoteIdent } from '../identifiers.js';
import type { Logger } from '../logger.js';
import { chooseApply, recordChoice, recordCost } from './apply-choice.js';
import { changedFromLedger, inRange } from './changed-sql.js';
import { advanceCursor } from './cursor.js';
import { applyChanged } from './pages.js';
import type { PlanCache } from './plan-cache.js';
import { type AppliedWork, appliedWork } from './tally.js';
import { enterTransformWork } from './work-settings.js';

/** Changed keys per drain page: big enough to amortise a statement, small enough to share. */
export const PAGE_ROWS = 20_000;

/** Key-hash buckets a big range of a single-table transform is split into. */
export const BUCKETS = 4;

interface Candidate {
  transform_id: number;
  lo_snap: string;
  hi_seq: string;
  hi_snap: string;
  source_ids: number[];
  /** One source table (a projection, filter or GROUP BY of one table). */
  single_table: boolean;
  /** This session's backend and when it took the range, by the server's clock (work events). */
  backend: number;
  claimed_ms: number;
}

/**
 * Opens the next ledger range for one transform that is behind: everything after its
 * cursor up to the newest tick, split into pages of about PAGE_ROWS changed keys (by
 * ledger blocks, so each page reads only its own), and for a single-table transform
 * further by key hash into BUCKETS, whose pages can be applied at once. A range with no
 * changes moves the cursor at once, and with it every other transform's that has none
 * either (one statement, `<schema>._advance_idle_cursors`); one holding a TRUNCATE of a
 * source sends the transform to be rebuilt. Says whether it opened a range (work to do),
 * only advanced cursors over empty ranges (others may be behind with changes), or found
 * no transform behind.
 */
export type OpenRangeResult = 'none' | 'advanced' | 'opened';

export async function openRange(
  session: Session,
  schema: string,
  plans: PlanCache,
  log: Logger,
): Promise<{ result: OpenRangeResult; applied: AppliedWork | null }> {
  const s = quoteIdent(schema);
  let applied: AppliedWork | null = null;
  const result = await session.transaction(async (): Promise<OpenRangeResult> => {
    const [c] = await session.query<Candidate>(
      `SELECT pl.transform_id, lo.snap::text AS lo_snap, hi.seq AS hi_seq, hi.snap::text AS hi_snap,
              ARRAY(SELECT DISTINCT src.id FROM ${s}.transform_sources ts
                      JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                     WHERE ts.transform_id = pl.transform_id) AS source_ids,
              (SELECT count(*) FROM ${s}.transform_sources ts
                WHERE ts.transform_id = pl.transform_id) = 1 AS single_table,
              pg_backend_pid() AS backend,
              (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS claimed_ms,
              -- For the rest of this transaction: the range's bounds decide whether the
              -- ledger's BRIN index pays, so plan for them (a generic plan would read the
              -- whole ledger). Set here, not in a round trip of its own.
              set_config('plan_cache_mode', 'force_custom_plan', true) AS plan_cache_mode
         FROM ${s}.pipeline pl
         JOIN ${s}.transforms t ON t.id = pl.transform_id
         JOIN ${s}.ticks lo ON lo.seq = pl.cursor_tick
         CROSS JOIN LATERAL (SELECT seq, snap FROM ${s}.ticks ORDER BY seq DESC LIMIT 1) hi
         -- Least served first (ADR 0045).
         LEFT JOIN ${s}._drain_ranks() r ON r.transform_id = pl.transform_id
        WHERE pl.phase IN ('catching_up', 'live') AND t.paused_at IS NULL
          AND pl.open_lo IS NULL AND hi.seq > pl.cursor_tick
          -- A source change being followed: its re-derivation moves the cursor (ADR 0047).
          AND NOT pl.follow_pending
          AND NOT coalesce(r.reserved, false)
        ORDER BY r.serving, r.recent, pl.updated_at
        LIMIT 1
          FOR UPDATE OF pl SKIP LOCKED`,
    );
    if (!c) return 'none';
    const range = `l.source_id = ANY ($1::int[]) AND ${inRange('l.xid', '$2', '$3')}`;
    const params = [c.source_ids, c.lo_snap, c.hi_snap];
    const [stats] = await session.query<{ n: string; truncated: boolean | null }>(
      `SELECT coalesce(sum(cardinality(l.keys)), 0) AS n, bool_or(l.keys IS NULL) AS truncated
         FROM ${s}.ledger l WHERE ${range}`,
      params,
    );
    const rows = Number(stats?.n ?? 0);
    if (stats?.truncated && (await columnChangeToFollow(session, schema, c.transform_id))) {
      // Most likely written by capture while its triggers named a column since renamed: the
      // staging worker follows the change and re-derives the target whole, in one
      // transaction (ADR 0047), moving the cursor past this range. Left to it meanwhile.
      return 'advanced';
    }
    if (stats?.truncated) {
      // A TRUNCATE leaves no keys to re-derive: build the target again from its sources.
      await session.query(`SELECT ${s}._request_rebuild($1)`, [c.transform_id]);
      return 'opened';
    }
    if (rows === 0) {
      await advanceCursor(session, schema, c.transform_id, c.hi_seq);
      // Nothing here: most likely nothing either for the others behind the same tick (a
      // write to one table leaves every other transform behind). All of them move on in
      // one statement, rather than a transaction each.
      await session.query(`SELECT ${s}._advance_idle_cursors()`);
      return 'advanced';
    }
    const plan = await plans.load(session, c.transform_id);
    const choice = await chooseApply(session, schema, plan, rows);
    await recordChoice(session, schema, plan, choice, log);
    if (rows <= PAGE_ROWS || choice.mode === 'recompute') {
      // A small range (the common case when live), or one recomputing every group, is
      // applied at once, in this transaction: no page to write, claim and delete. If it
      // fails for no row's fault, it becomes pages after all (re-derived), which are
      // retried with backoff and reported.
      const started = performance.now();
      await enterTransformWork(session, schema, plan);
      const { failure, tally, paused } = await applyChanged(
        session,
        schema,
        plan,
        changedFromLedger(schema, plan, null),
        [c.lo_snap, c.hi_snap],
        log,
        choice.mode,
      );
      applied = appliedWork(plan.target, tally, started, failure !== null);
      // Like a page's record (pages.ts): which backend applied which keys, and when. Its end
      // is the server's start plus the time this process measured.
      log.debug(
        {
          target: plan.target,
          keys: tally.keys,
          backend: c.backend,
          fromMs: c.claimed_ms,
          toMs: c.claimed_ms + applied.seconds * 1000,
        },
        'a range applied',
      );
      // Paused at quarantineThreshold partway: the range becomes pages (below), applied
      // again after RESUME; what it held and applied so far is kept.
      if (failure === null && !paused) {
        await recordCost(session, schema, plan, choice.mode, tally.keys, applied.seconds * 1000);
        await advanceCursor(session, schema, c.transform_id, c.hi_seq);
        return 'opened';
      }
    }
    let pages: Array<{ gen: number | null; lo: number | null; hi: number | null }>;
    // A single-table transform's changed keys are its driving keys: split by key hash,
    // pages of different buckets hold different keys (and key map rows), and apply in
    // parallel (ADR 0029). A projection's keys are its target rows. A GROUP BY's pages
    // may recompute the same group at once: each from a snapshot that sees every change
    // of the range, so whichever commits last is right for the range (later changes come
    // with later ranges, opened once every page is done); their upserts take the groups
    // in key order. A join's driving keys are found through the other tables' changes,
    // which hash apart from them: one bucket.
    // Delta ranges go one page at a time: a page computes its groups' new states from the
    // states it reads (delta-sql.ts), so two pages of one group at once would lose one.
    const buckets = rows > PAGE_ROWS && c.single_table && !plan.delta ? BUCKETS : 1;
    if (rows <= PAGE_ROWS) {
      pages = [{ gen: null, lo: null, hi: null }];
    } else {
      const blocks = await session.query<{ gen: number; blk: string; n: string }>(
        `SELECT l.gen, (l.ctid::text::point)[0]::bigint AS blk, sum(cardinality(l.keys)) AS n
           FROM ${s}.ledger l WHERE ${range}
          GROUP BY 1, 2 ORDER BY 1, 2`,
        params,
      );
      pages = [];
      let open: { gen: number; lo: number; hi: number; rows: number } | undefined;
      for (const b of blocks) {
        const blk = Number(b.blk);
        if (!open || open.gen !== b.gen || open.rows >= PAGE_ROWS) {
          if (open) pages.push(open);
          open = { gen: b.gen, lo: blk, hi: blk + 1, rows: 0 };
        }
        open.hi = blk + 1;
        open.rows += Number(b.n);
      }
      if (open) pages.push(open);
    }
    await session.query(
      `INSERT INTO ${s}.pages (transform_id, page, gen, blk_lo, blk_hi, bucket, buckets)
       SELECT $1, (p.ord - 1) * $3 + b, p.gen, p.lo, p.hi, b, $3
         FROM ROWS FROM (jsonb_to_recordset($2::jsonb) AS (gen smallint, lo bigint, hi bigint))
              WITH ORDINALITY AS p(gen, lo, hi, ord)
        CROSS JOIN generate_series(0, $3 - 1) AS b`,
      [c.transform_id, pages, buckets],
    );
    await session.query(
      `INSERT INTO ${s}.page_slots (transform_id, bucket)
       SELECT $1, b FROM generate_series(0, $2 - 1) AS b ON CONFLICT DO NOTHING`,
      [c.transform_id, buckets],
    );
    await session.query(
      `UPDATE ${s}.pipeline
          SET open_lo = cursor_tick, open_hi = $2, open_pages = $3, pages_left = $3, updated_at = now()
        WHERE transform_id = $1`,
      [c.transform_id, c.hi_seq, pages.length * buckets],
    );
    return 'opened';
  });
  return { result, applied };
}

/**
 * Whether a column the transform reads was renamed or retyped since it was bound, which the
 * staging worker has yet to follow: if so, the transform is left to it (follow_pending).
 */
async function columnChangeToFollow(
  session: Session,
  schema: string,
  transformId: number,
): Promise<boolean> {
  const s = quoteIdent(schema);
  const [row] = await session.query<{ pending: boolean }>(
    `WITH changed AS (
       SELECT 1 FROM ${s}.transform_sources ts
        CROSS JOIN LATERAL jsonb_array_elements(ts.read_attrs) r
        JOIN pg_attribute a ON a.attrelid = ts.source_oid AND a.attnum = (r->>'attnum')::int
       WHERE ts.transform_id = $1 AND NOT a.attisdropped
         AND (a.attname <> r->>'name' OR format_type(a.atttypid, a.atttypmod) <> r->>'type'))
     UPDATE ${s}.pipeline SET follow_pending = true
      WHERE transform_id = $1 AND EXISTS (SELECT 1 FROM changed)
     RETURNING true AS pending`,
    [transformId],
  );
  return row?.pending === true;
}
